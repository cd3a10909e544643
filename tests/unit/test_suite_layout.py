"""The suite's files have unique names: the test folders are not packages, so two `test_x.py` in two folders make
pytest refuse both ("import file mismatch") and the checks they make silently leave the run as collection errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_every_test_file_name_is_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []

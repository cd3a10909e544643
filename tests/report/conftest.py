"""The report tests' shared recording: one real smoke sweep, recorded once per session."""

from __future__ import annotations

import pytest

from ddptop.cli import main
from smoke_run import record_smoke


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smoke")
    record = record_smoke(folder)
    out = folder / "report"
    assert main(["report", str(record), "-o", str(out)]) == 0
    return record, out

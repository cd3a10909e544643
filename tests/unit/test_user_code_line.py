"""errors.user_code_line on an exception from a DataLoader worker process: torch (torch._utils.ExceptionWrapper, the
real one) raises it again in the rank with the worker's traceback only as text; the user's frame is read from there.
Truth: the line numbers of the file this test writes."""

from __future__ import annotations

import importlib.util

import pytest
from torch._utils import ExceptionWrapper

from ddptop import errors

CODE = '''
def plain(items):
    raise ValueError("item 3 has no label\\nand a second line")


def chained(items):
    try:
        return items["label"]
    except KeyError:
        raise RuntimeError("no label in this batch")


def missing(items):
    return items["label"]  # no such key
'''


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(CODE.splitlines(), 1) if text in line)


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    path = tmp_path / "user_code.py"
    path.write_text(CODE)
    spec = importlib.util.spec_from_file_location("user_code_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(errors, "USER_FILES", {str(path)})
    return module


def reraised(fn) -> BaseException:
    """What the rank catches: the worker's exception wrapped as torch wraps it, then raised again here."""
    try:
        fn({})
    except Exception:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    try:
        wrapper.reraise()
    except Exception as exc:
        return exc
    raise AssertionError("reraise did not raise")


@pytest.mark.parametrize("name, said", [
    ("plain", f"user_code.py:{line_of('item 3 has no label')} in plain: ValueError: item 3 has no label"),
    # a chained exception: the traceback of the one raised last, not of the one it was handling
    ("chained", f"user_code.py:{line_of('no label in this batch')} in chained: RuntimeError: no label in this batch"),
    ("missing", f"user_code.py:{line_of('no such key')} in missing: KeyError: 'label'"),
])
def test_a_loader_workers_exception_names_the_users_frame(user_code, name, said):
    exc = reraised(getattr(user_code, name))
    assert errors.user_code_line(exc) == f"your code raised at {said}"


def test_a_loader_workers_exception_outside_the_users_code_is_not_theirs(user_code):
    def torch_side(items):
        return items["label"]  # this test's file is not among the user's

    assert errors.user_code_line(reraised(torch_side)) is None

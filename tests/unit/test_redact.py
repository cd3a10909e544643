"""A recording keeps the command line without the job token (ddptop.record.sqlite.redact)."""

from __future__ import annotations

import pytest

from ddptop.record.sqlite import base_meta, redact
from ddptop.report.runs import command


@pytest.mark.parametrize("argv,expected", [
    (["ddptop", "--token", "s3cret", "--rank", "0"], ["ddptop", "--token", "REDACTED", "--rank", "0"]),
    (["ddptop", "--token=s3cret"], ["ddptop", "--token=REDACTED"]),
    (["ddptop", "--token"], ["ddptop", "--token"]),  # nothing after it: nothing to hide
    (["ddptop", "--token", "--token", "x"], ["ddptop", "--token", "REDACTED", "x"]),
    (["ddptop", "--tokens", "x", "--profile", "token"], ["ddptop", "--tokens", "x", "--profile", "token"]),
])
def test_redact(argv, expected):
    assert redact(argv) == expected


def test_the_meta_and_an_older_recordings_command_hide_the_token():
    assert "s3cret" not in repr(base_meta({}, {}, ["ddptop", "--token", "s3cret"]))
    assert command(["/x/ddptop/__main__.py", "--token", "s3cret", "--headless"]) == \
        "ddptop --token REDACTED --headless"

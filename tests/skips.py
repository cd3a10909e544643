"""Which skips may stand: under CI (`CI=true`, as CI runs .ci/run) a skip is a failure, but for one kind.

A missing tmux, iproute2, setpriv, namespace or cgroup would otherwise turn the real-world evidence into a green
run. The one skip CI keeps: tests/gpu on a machine without a GPU (CI never has one), and only with that reason.
"""

from __future__ import annotations

import os

GPU_SKIP = "no CUDA device"  # tests/gpu's reason starts with this
CI_MAY_SKIP = (("tests/gpu/", GPU_SKIP),)


def ci_failure(path: str, reason: str) -> str:
    """'' when this skip of the test file at `path` (from the repository root) may stand, else the line failing it."""
    if os.environ.get("CI") != "true" or any(path.startswith(p) and reason.startswith(r) for p, r in CI_MAY_SKIP):
        return ""
    return f"CI=true: a skip is a failure here: {reason}"

"""A tmux server of a test's own (`tmux -L SOCKET`), killed when the test ends, and the suite's check that none is
left: the tests that drive a real terminal used the user's default server, which outlived the suite."""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess

PREFIX = "ddptop-test-"  # every socket this suite names starts so; the pid of the pytest process follows


class Tmux:
    """`tmux -L ddptop-test-PID-TAG ...`: its own server, so a test neither sees nor leaves anything in another's."""

    def __init__(self, tag: str):
        self.socket = f"{PREFIX}{os.getpid()}-{tag}"

    def __call__(self, *args: str, check: bool = True) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=check,
                              timeout=30).stdout

    def kill(self) -> None:
        """The server and its socket file (a killed server may leave it)."""
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(socket_dir(), self.socket))


@contextlib.contextmanager
def tmux_server(tag: str):
    """A Tmux whose server is killed when the block ends, however it ends."""
    server = Tmux(tag)
    try:
        yield server
    finally:
        server.kill()


def socket_dir() -> str:
    """Where tmux puts its sockets (tmux(1): $TMUX_TMPDIR or /tmp, then tmux-UID)."""
    return os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp", f"tmux-{os.getuid()}")


def servers_left(pid: int | None = None) -> list[str]:
    """The sockets of this suite's tmux servers (of pytest process `pid`, default this one) that still answer; each
    is killed and its socket file removed, so that one test's leftover does not stay for the next run."""
    left = []
    for path in glob.glob(os.path.join(socket_dir(), f"{PREFIX}{pid or os.getpid()}-*")):
        server = Tmux.__new__(Tmux)
        server.socket = os.path.basename(path)
        if subprocess.run(["tmux", "-L", server.socket, "list-sessions"], capture_output=True,
                          timeout=30).returncode == 0:
            left.append(server.socket)
        server.kill()
    return left

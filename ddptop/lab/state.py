"""One state file per lab: its owner and every object it made, so a lab whose owner died can be removed later.

The file lists each namespace and cgroup *before* it is created, so even a lab killed halfway through its build
is found. Names are checked against the lab's own pattern before anything is removed: a damaged or hostile
state file cannot make ddptop delete a namespace or cgroup that a lab did not create.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

from ddptop.lab import cgroups, netns

STATE_ENV = "DDPTOP_LAB_DIR"
DEFAULT_DIR = "/run/ddptop-lab"  # tmpfs: a reboot removes the namespaces and the records of them together
PREFIX = "ddplab"
NAME = re.compile(rf"^{PREFIX}-[0-9a-f]{{6}}-(sw|n\d{{1,3}})$")
TAG = re.compile(r"^[0-9a-f]{6}$")


def state_dir() -> str:
    return os.environ.get(STATE_ENV) or DEFAULT_DIR


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): with the pid, its identity.

    None when there is no such process, or only its zombie (which holds no namespace and runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


@dataclass
class LabRecord:
    tag: str
    owner_pid: int
    owner_start: str | None
    created: float
    nodes: int = 0
    link: str = ""
    cpus: str = ""
    namespaces: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    @property
    def folder(self) -> str:
        """The lab's own files: worker logs, the job files `ddptop ctl` finds (DDPTOP_STATE_DIR)."""
        return os.path.join(state_dir(), self.tag)

    @property
    def path(self) -> str:
        return os.path.join(state_dir(), f"{self.tag}.json")

    def save(self) -> None:
        """Atomically: a reader never sees half a file."""
        os.makedirs(state_dir(), mode=0o700, exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(self), f)
        os.replace(tmp, self.path)

    def owner_alive(self) -> bool:
        return self.owner_start is not None and process_start(self.owner_pid) == self.owner_start


def load(path: str) -> LabRecord | None:
    """A record from a state file, or None when the file is not one (then it is left alone)."""
    try:
        with open(path) as f:
            data = json.load(f)
        record = LabRecord(**data)
    except (OSError, ValueError, TypeError):
        return None
    if not (isinstance(record.tag, str) and TAG.match(record.tag) and isinstance(record.owner_pid, int)
            and isinstance(record.namespaces, list) and isinstance(record.cgroups, list)):
        return None
    return record


def records(folder: str | None = None) -> Iterator[LabRecord]:
    folder = folder or state_dir()
    if not os.path.isdir(folder):
        return
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            record = load(os.path.join(folder, name))
            if record is not None and name == f"{record.tag}.json":
                yield record


def remove_lab(record: LabRecord, controller: cgroups.CpuController | str | None = None) -> list[str]:
    """Stop every process inside the lab and remove its namespaces, cgroups and files; what could not be removed."""
    own = f"{PREFIX}-{record.tag}-"
    namespaces = [n for n in record.namespaces if isinstance(n, str) and NAME.match(n) and n.startswith(own)]
    groups = [g for g in record.cgroups if _own_cgroup(g, record.tag, controller)]

    def inside() -> list[int]:
        return [pid for ns in namespaces for pid in netns.namespace_pids(ns)] + \
               [pid for g in groups for pid in cgroups.pids(g)]

    for _ in range(5):  # a process may fork between one look and the kill: look again until none is left
        pids = inside()
        if not pids:
            break
        _kill(pids)
    left = []
    for ns in sorted(namespaces, key=lambda n: n.endswith("-sw")):  # hosts first, the switch last
        netns.delete_namespace(ns)
        if netns.namespace_exists(ns):
            left.append(f"namespace {ns}")
    left += [f"cgroup {g}" for g in groups if not cgroups.remove(g)]
    if not left:
        shutil.rmtree(record.folder, ignore_errors=True)
        try:
            os.unlink(record.path)
        except OSError:
            pass
    return left


def _own_cgroup(path: object, tag: str, controller) -> bool:
    """A cgroup this lab made: named like a lab host, directly under the CPU controller's root."""
    name = os.path.basename(path) if isinstance(path, str) else ""
    if not NAME.match(name) or not name.startswith(f"{PREFIX}-{tag}-"):
        return False
    if not isinstance(controller, cgroups.CpuController):
        controller = cgroups.find_controller()
    return isinstance(controller, cgroups.CpuController) and os.path.dirname(path) == controller.root.rstrip("/")


def _kill(pids: list[int], wait_s: float = 5.0) -> None:
    """SIGKILL processes inside a dead lab (they are in its namespaces or cgroups, so they are the lab's)."""
    for pid in set(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    while any(process_start(p) is not None for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def remove_dead_labs() -> list[str]:
    """Remove every lab whose owner process is gone; other labs (other users, concurrent tests) stay. Their tags."""
    removed = []
    for record in records():
        if not record.owner_alive():
            remove_lab(record)
            removed.append(record.tag)
    return removed

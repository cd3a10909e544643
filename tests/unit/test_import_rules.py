"""DESIGN.md's import rules: layers import one way, no module imports itself in a circle, the core never imports
textual, the replay side never imports torch.

The layer rules read every `import` in ddptop's source (those inside functions too), so a lazy import that runs
upward fails here as surely as one at the top of a file."""

from __future__ import annotations

import ast
import functools
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "ddptop"
BASE = {"ddptop", "errors", "safe", "config", "profiles", "rendezvous", "events", "testhooks"}  # ddptop: the package's __init__
# cli → front → {tui, report, lab, train, …} → metrics → events and the base: what each part may import besides
# itself and the base. Everything else is an arrow from a lower layer up.
ALLOWED = {
    "__main__": {"cli"},
    "api": {"front", "record", "control", "train", "probes", "metrics"},  # the user's own loop (ddptop/api.py)
    "examples": {"api"},  # the example code installed with ddptop: a user's model, loop, wire-lab's model
    "cli": {"front", "tui", "report", "lab", "record", "state", "control", "train", "probes", "sources", "metrics"},
    "front": {"tui", "report", "record", "state", "control", "train", "metrics"},
    "tui": {"state", "control", "record", "metrics"},
    "report": {"record", "metrics"},
    "lab": {"report", "record", "control", "metrics"},
    "train": {"control", "probes", "sources", "metrics"},
    "record": {"metrics"},
    "state": {"metrics"},
    "control": {"metrics"},
    "probes": {"metrics"},
    "sources": set(),
    "metrics": set(),
}
for name in BASE:
    ALLOWED[name] = set()
CORE = ["ddptop.train.worker", "ddptop.front.supervisor", "ddptop.probes.step", "ddptop.sources.sampler",
        "ddptop.control.agent", "ddptop.control.client", "ddptop.record.sqlite", "ddptop.front.headless",
        "ddptop.front.run", "ddptop.front.pipeline", "ddptop.metrics", "ddptop.state.session"]
NO_TORCH = ["ddptop.events", "ddptop.record.reader", "ddptop.record.replay", "ddptop.record.export",
            "ddptop.state.session", "ddptop.report.analysis", "ddptop.metrics", "ddptop.metrics.traffic",
            "ddptop.metrics.timeline", "ddptop.metrics.wire", "ddptop.cli", "ddptop.cli.lab", "ddptop.lab.launch",
            "ddptop.lab.summary", "ddptop.control.client", "ddptop.cli.ctl", "ddptop.front.feed",
            "ddptop.front.headless", "ddptop.front.pipeline", "ddptop.front.replay"]


def module_name(path: pathlib.Path) -> str:
    parts = ["ddptop", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ddptop"


def imports() -> dict[str, set[str]]:
    """module → the ddptop modules it imports (a name imported from a package counts as that submodule)."""
    known = {module_name(p) for p in ROOT.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("ddptop"))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ddptop"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if sub in known else node.module)
        out[module_name(path)] = found
    return out


def test_every_part_of_ddptop_has_a_layer():
    assert {layer(m) for m in imports()} <= set(ALLOWED), "a new top-level part: give it a place in ALLOWED"


def test_imports_run_one_way():
    wrong = sorted(f"{m} imports {t}" for m, targets in imports().items() for t in targets
                   if layer(t) != layer(m) and layer(t) not in BASE and layer(t) not in ALLOWED[layer(m)])
    assert not wrong, "imports from a lower layer up:\n" + "\n".join(wrong)


def test_no_import_circle():
    """Modules and the packages that hold them: a circle through a lazy import is still a circle."""
    graph = imports()
    for module, targets in graph.items():  # a package's __init__ importing its own modules is how packages work
        graph[module] = {t for t in targets if not module.startswith(t + ".") and not t.startswith(module + ".")
                         or layer(t) != layer(module)}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                pytest.fail("import circle: " + " → ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_rule_finds_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a metrics module that imports the front is reported."""
    fake = tmp_path / "ddptop"
    (fake / "metrics").mkdir(parents=True)
    (fake / "front").mkdir()
    (fake / "metrics" / "__init__.py").write_text("from ddptop.front import feed\n")
    (fake / "front" / "__init__.py").write_text("")
    (fake / "front" / "feed.py").write_text("from ddptop import metrics\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    with pytest.raises(AssertionError, match="ddptop.metrics imports ddptop.front.feed"):
        test_imports_run_one_way()
    with pytest.raises(pytest.fail.Exception, match="import circle"):
        test_no_import_circle()


@functools.lru_cache(maxsize=None)
def loaded_in_turn(modules: tuple[str, ...]) -> dict[str, set[str]]:
    """One fresh interpreter imports `modules` one after another; for each, the top-level packages loaded once it
    was imported (cumulative). A banned package first seen after module k was brought by k's own imports: it was not
    there before, so k's test and every later one fail, the first naming the culprit. One interpreter, not one per
    module: the core's twelve each imported torch (~1.7 CPU-s apiece)."""
    code = ("import sys, importlib\n"
            f"for m in {list(modules)!r}:\n"
            "    importlib.import_module(m)\n"
            "    print(m, ' '.join(sorted({n.split('.')[0] for n in sys.modules})), flush=True)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    out = {}
    for line in result.stdout.splitlines():
        module, _, names = line.partition(" ")
        out[module] = set(names.split())
    assert list(out) == list(modules), result.stdout
    return out


def test_a_banned_import_is_found_in_the_module_that_brings_it():
    """The checker itself: json brings no textual; importing textual's own package does, from then on."""
    seen = loaded_in_turn(("json", "textual", "csv"))
    assert "textual" not in seen["json"] and "textual" in seen["textual"] and "textual" in seen["csv"]


@pytest.mark.parametrize("module", CORE)
def test_the_core_never_imports_textual(module):
    assert "textual" not in loaded_in_turn(tuple(CORE))[module]


@pytest.mark.parametrize("module", NO_TORCH)
def test_replay_side_never_imports_torch(module):
    assert "torch" not in loaded_in_turn(tuple(NO_TORCH))[module]

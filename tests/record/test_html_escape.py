"""report.html shows every text a recording holds as text: no link, script or event handler comes from it.

A real recording (the session's 2-rank job) is rewritten with sqlite3: every text field the events, system
samples, spans and meta hold (command line, hosts, versions, layer and NIC names, log lines, run-finished reasons,
…) gets hostile text appended, where ddptop's own decoder still accepts the row. The produced HTML is then parsed
with the stdlib's html.parser, not searched with ddptop's own patterns. Before the fix the recorded command line,
inside a code span, became a live `<a href="javascript:…">`.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from html.parser import HTMLParser

import pytest

from ddptop.cli import main
from ddptop.events import LogLine, RunFinished
from ddptop.record import schema

MARK = "pwn3d"
HOSTILE = (f" {MARK} [x](javascript:alert(1)) `[y](javascript:alert(2))` <script>alert(3)</script> "
           "\"><img src=x onerror=alert(4)> ' onmouseover='alert(5) javascript:alert(6) **b** *i* |")


def _hostile(value, accept):
    """`value` with HOSTILE appended to each string leaf that `accept` (ddptop's decoder) still takes."""
    if isinstance(value, dict):
        for key in value:
            if key not in ("kind", "strategy", "compress", "shard_unit"):  # checked by ddptop (a bad one: exit 6)
                value[key] = _hostile_leaf(value, key, accept)
    elif isinstance(value, list):
        for i in range(len(value)):
            value[i] = _hostile_leaf(value, i, accept)
    return value


def _hostile_leaf(holder, key, accept):
    old = holder[key]
    if isinstance(old, (dict, list)):
        return _hostile(old, accept)
    if not isinstance(old, str):
        return old
    holder[key] = old + HOSTILE
    ok = accept()
    holder[key] = old
    return old + HOSTILE if ok else old


def _accepts(decode, *args):
    def accept():
        try:
            decode(*args)
            return True
        except Exception:
            return False
    return accept


def poison(db: sqlite3.Connection) -> None:
    db.executemany("INSERT INTO events (seq, at, kind, rank, step, t, data) VALUES "
                   "((SELECT max(seq) + 1 FROM events), (SELECT max(at) FROM steps), ?, ?, NULL, 0, ?)",
                   [(e.kind, e.rank, json.dumps(e.to_dict())) for e in (
                       LogLine(1, "error", "a log line", 0.0), RunFinished(1, 3, "error: a reason", 0.0))])
    for seq, data in db.execute("SELECT seq, data FROM events").fetchall():
        event = json.loads(data)
        _hostile(event, lambda: _accepts(schema.decode_event, json.dumps(event))())
        db.execute("UPDATE events SET data = ? WHERE seq = ?", (json.dumps(event), seq))
    for seq, nics, gpus in db.execute("SELECT seq, nics, gpus FROM system").fetchall():
        nics = _hostile(json.loads(nics), lambda: True)
        db.execute("UPDATE system SET host = host || ?, nics = ?, gpus = ? WHERE seq = ?",
                   (HOSTILE, json.dumps(nics), json.dumps(_hostile(json.loads(gpus), lambda: True)), seq))
    for seq, spans in db.execute("SELECT seq, spans FROM spans").fetchall():
        db.execute("UPDATE spans SET spans = ? WHERE seq = ?", (json.dumps(_hostile(json.loads(spans),
                                                                                    lambda: True)), seq))
    meta = {key: json.loads(value) for key, value in db.execute("SELECT key, value FROM meta")}
    meta["argv"] = ["ddptop", "--headless", "--record", f"run{HOSTILE}.db", HOSTILE]
    meta["versions"] = {"ddptop": "0.1" + HOSTILE, "torch" + HOSTILE: "2"}
    meta["ranks"] = {str(r): {k: f"{k}{HOSTILE}" for k in ("host", "device", "backend", "threads", "torch_version")}
                     for r in (0, 1)}
    meta["config"] = {**meta["config"], "profile": "p" + HOSTILE, "dataset": "synthetic" + HOSTILE,
                      "model": "tiny" + HOSTILE, "seed": "s" + HOSTILE}
    meta["created"] = "c" + HOSTILE
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, list]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def hostile_report(recording, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    path = folder / "hostile.db"
    shutil.copy(recording, path)
    with sqlite3.connect(path) as db:
        poison(db)
    db.close()
    assert main(["report", str(path), "-o", str(folder / "report"), "--formats", "png"]) == 0
    return (folder / "report" / "report.html").read_text()


def test_no_link_script_or_handler_comes_from_recorded_text(hostile_report):
    page = Tags()
    page.feed(hostile_report)
    text = "".join(page.text)
    # the hostile text is on the page, as text, in many places: command, hosts, versions, model, logs, reasons
    assert text.count(MARK) >= 8, text
    assert "<script>alert(3)</script>" in text and "[x](javascript:alert(1))" in text
    for tag, attrs in page.tags:
        assert tag in {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "ul", "li", "b", "i",
                       "code", "pre", "table", "tr", "th", "td", "blockquote", "figure", "img", "figcaption", "a"}, tag
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name, value)
            assert name in {"charset", "href", "alt", "src", "class"}, (tag, name)
            if name in ("href", "src"):
                assert "javascript" not in (value or "").lower(), (tag, name, value)
            if name == "src":
                assert value.startswith("data:image/png;base64,"), value
            if name == "alt":
                assert MARK not in value  # figure titles are ddptop's own words

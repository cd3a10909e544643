"""Provides the key table, defined once: the help screen and the README list it, the bindings follow it."""

from __future__ import annotations

GLOBAL_KEYS = (
    ("q", "quit: stop the ranks this ddptop started, flush the recording, leave"),
    ("?", "this help"),
    ("space", "pause / resume training (replay: play / pause)"),
    ("1 … 8", "panels: overview, ranks, network, utilization, timeline, loss, controls, what-if"),
    ("tab / shift+tab", "next / previous panel (in the controls: next / previous field)"),
    ("pgup / pgdn", "scroll the panel a page (the mouse wheel scrolls too)"),
    ("home / end", "scroll to the panel's top / bottom"),
    ("o", "the overview's sections: show or hide each (kept for the next screen)"),
    ("t", "theme: dark / light (kept for the next screen; --theme for one session)"),
    ("ctrl+x / ctrl+o", "hide the panel shown (its number shows it again) / show every panel"),
)
PANEL_KEYS = (
    ("overview", "everything at a glance: ranks, where the time goes, the segment table, plots, network"),
    ("ranks", "↑ ↓ pick a rank · enter: its timeline"),
    ("ranks (16 and up)", "↑ ↓ pick among the lowest scores · enter: the rank's detail · n: its node's · h: "
                          "the heatmap's figure"),
    ("network", "↑ ↓ node · ← → interface · enter: the node's detail"),
    ("timeline", "← → previous / next sampled step · ↑ ↓ rank · < / >: first / latest sampled step"),
    ("controls", "↑ ↓ or tab between fields; digits go into number fields · esc discards edits · enter applies "
                 "(live only)"),
    ("what-if", "the model's predictions from the segment in force; after each switch, prediction vs measured"),
)
REPLAY_KEYS = (
    ("space", "play / pause"),
    ("+ / -", "faster / slower (0.5× … 16×)"),
    (", / .", "seek 10 steps back / forward"),
    ("[ / ]", "previous / next segment (config change)"),
    ("g", "seek to a step: type it in the transport bar"),
)
MOUSE = "Mouse: click a tab, a rank row, a node or interface, a button; the wheel scrolls long panels."


def help_text(replay: bool) -> str:
    lines = ["Keys", ""]
    lines += [f"  {k:<17} {v}" for k, v in GLOBAL_KEYS]
    lines += ["", "Inside panels", ""] + [f"  {k:<17} {v}" for k, v in PANEL_KEYS]
    lines += ["", "Replay" + ("" if replay else " (ddptop replay FILE)"), ""]
    lines += [f"  {k:<17} {v}" for k, v in REPLAY_KEYS]
    lines += ["", MOUSE, "", "esc, q or ? closes this help."]
    return "\n".join(lines)

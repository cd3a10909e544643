"""Provides the one palette: colours from Okabe & Ito's colour-blind-safe set, each category also with a glyph.

The eight Okabe-Ito colours stay distinct for the common colour-blindnesses and, downsampled to a 256-colour
terminal (tmux), land on eight different xterm colours (e.g. backward #0072B2 → 25, exposed comm #D55E00 → 166).
Nothing is told by colour alone: every bar category has its own glyph, every plotted series its label.

Two themes (`use`): on a light background Okabe-Ito's yellow (#F0E442) is nearly invisible (1.2:1 against white)
and its sky blue and orange are faint as text (2.2:1, 2.1:1), so the light theme draws them darker (LIGHT: 4.3:1,
4.0:1, 3.7:1) and the timeline's empty cells light instead of dark. Glyphs still tell every category apart.
"""

from __future__ import annotations

from ddptop.metrics import MICRO

ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2",
                                                       "#D55E00", "#CC79A7")
GREY, DARK = "#999999", "#5f5f5f"
LIGHT_YELLOW = "#8F7A00"  # the light theme's yellow
LIGHT = {YELLOW: LIGHT_YELLOW, SKY: "#2A7AB0", ORANGE: "#A86A00"}  # the light theme's darker versions
EMPTY = "grey23"  # a timeline cell with nothing in it (the light theme: grey82)
NOTE = "yellow"  # the terminal's own yellow: plot markers, "paused" in the header (the light theme: LIGHT_YELLOW)

# the parts of a step (ddptop.metrics.parts), in the order a step runs them: (colour, glyph)
PARTS: dict[str, tuple[str, str]] = {
    "data": (GREY, "░"),
    MICRO: (YELLOW, "▚"),  # accum > 1: compute, before the synchronized micro-step's forward
    "forward": (SKY, "█"),
    "backward": (BLUE, "▓"),
    "exposed comm": (VERMILLION, "╳"),
    "optimizer": (GREEN, "≡"),
    "ddptop": (PURPLE, "•"),
    "other": (DARK, "·"),
    "compute": (SKY, "█"),  # a step without spans: forward + backward + optimizer
}
# span kinds (ddptop.events.SPAN_KINDS) as the timeline draws them
SPANS: dict[str, tuple[str, str]] = {
    "data": PARTS["data"], "fwd": PARTS["forward"], "bwd": PARTS["backward"], "comm": (VERMILLION, "█"),
    "wait": (ORANGE, "▒"), "opt": PARTS["optimizer"], "overlap": (GREEN, "▀"),
}
# plotted series: (colour, label) — ranks cycle through these, and every line is labelled at its end
SERIES = (SKY, ORANGE, GREEN, PURPLE, BLUE, YELLOW, VERMILLION, GREY)
RX, TX = SKY, ORANGE  # network: received above the line, sent below (slurm's layout)
MARKER = YELLOW  # configuration changes
STATES = {"running": GREEN, "paused": YELLOW, "lost": f"bold {VERMILLION}", "error": f"bold {VERMILLION}",
          "done": SKY, "stopped": SKY, "starting": "dim", "finished": SKY}


_DARK_THEME = {"PARTS": dict(PARTS), "SPANS": dict(SPANS), "STATES": dict(STATES), "SERIES": SERIES,
               "MARKER": MARKER, "EMPTY": EMPTY, "NOTE": NOTE, "SKY": SKY, "ORANGE": ORANGE, "YELLOW": YELLOW}
THEME = "dark"


def use(theme: str) -> None:
    """Draw in `theme` ('dark' or 'light') from now on: the tables above are changed in place and the names rebound,
    so every renderer that reads them through this module (`palette.SKY`, never a copy imported by value) draws the
    new colours at its next frame."""
    global SERIES, MARKER, EMPTY, NOTE, THEME, SKY, ORANGE, YELLOW, RX, TX, HEAT
    swap = (lambda c: LIGHT.get(c, c)) if theme == "light" else (lambda c: c)
    for name, table in (("PARTS", PARTS), ("SPANS", SPANS)):
        table.update({k: (swap(colour), glyph) for k, (colour, glyph) in _DARK_THEME[name].items()})
    STATES.update({k: swap(v) for k, v in _DARK_THEME["STATES"].items()})
    SERIES = tuple(swap(c) for c in _DARK_THEME["SERIES"])
    MARKER = swap(_DARK_THEME["MARKER"])
    SKY, ORANGE, YELLOW = (swap(_DARK_THEME[name]) for name in ("SKY", "ORANGE", "YELLOW"))
    RX, TX = SKY, ORANGE
    HEAT = tuple((swap(colour), glyph) for colour, glyph in _DARK_HEAT)
    EMPTY = "grey82" if theme == "light" else _DARK_THEME["EMPTY"]
    NOTE = LIGHT_YELLOW if theme == "light" else _DARK_THEME["NOTE"]
    THEME = theme


def part_style(name: str) -> str:
    return PARTS.get(name, (DARK, "·"))[0]


def part_glyph(name: str) -> str:
    return PARTS.get(name, (DARK, "·"))[1]


def series_style(i: int) -> str:
    return SERIES[i % len(SERIES)]


# a heatmap cell by its level (metrics.ranks.heat_level: 0 below 1.25× the median, 3 at 2× and above): colour and
# glyph, so the hot cells read in a terminal without colour too; HOT is the top level's colour
HEAT = ((DARK, "░"), (YELLOW, "▒"), (ORANGE, "▓"), (VERMILLION, "█"))
HOT = HEAT[-1][0]
_DARK_HEAT = HEAT

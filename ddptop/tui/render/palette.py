"""Provides the one palette: colours from Okabe & Ito's colour-blind-safe set, each category also with a glyph.

The eight Okabe-Ito colours stay distinct for the common colour-blindnesses and, downsampled to a 256-colour
terminal (tmux), land on eight different xterm colours (e.g. backward #0072B2 → 25, exposed comm #D55E00 → 166).
Nothing is told by colour alone: every bar category has its own glyph, every plotted series its label.
"""

from __future__ import annotations

from ddptop.metrics import MICRO

ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2",
                                                       "#D55E00", "#CC79A7")
GREY, DARK = "#999999", "#5f5f5f"

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

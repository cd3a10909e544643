"""Provides the status header: the run state first (it never scrolls or truncates away), then progress, rate,
ddptop's own cost (shortened, then left out, where the line would cut the recording's name) and the recording; the
config in force and the job; the newest warning, action or notice."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.metrics import tables
from ddptop.state.session import Snapshot
from ddptop.tui.render import palette
from ddptop.tui.render.palette import STATES, VERMILLION
from ddptop.tui.render.tables import rate_unit
from ddptop.safe import clean
from ddptop.tui.render.units import fmt_bytes, fmt_s


def run_state(snap: Snapshot, mode: str, replay: dict | None) -> tuple[str, str]:
    """(word, style): live `running`/`paused`/`finished`; a replay says its own transport and the job's state."""
    state = snap.run_state
    if mode != "replay":
        return state, STATES.get(state, "dim")
    if not replay:
        return f"replay · {state}", "dim"
    playing = f"▶ playing {replay.get('speed', 1):g}×" if replay.get("playing") else "⏸ paused"
    return f"{playing} · job {state}", STATES.get(state, "dim")


def own_cost(snap: Snapshot, room: int | None = None) -> str:
    """ddptop's own time on the training thread, mean over running ranks' recent steps, and its share; then the CPU
    its other threads spend per step on a rank, and its front's per job step. `room`: the columns left for it; the
    longest wording that fits (the figures kept, the words shortened, then the share alone, then nothing), so the
    recording's name after it is not cut for it."""
    figures = [snap.recent(r) for r in snap.running]
    figures = [f for f in figures if f.steps]
    if not figures:
        return ""
    own = sum(f.own_s for f in figures) / len(figures)
    step = sum(f.step_s for f in figures) / len(figures)
    if not (step > 0 and own > 0):  # 0: an older file
        return ""
    threads = sum(f.threads_s for f in figures) / len(figures)  # issue 42: beside own_s, CPU not step time
    front = snap.front_s  # the front process's CPU per job step (front.cost): rank 0's host pays it once
    share = f"ddptop {fmt_s(own)} {own / step:.1%}"
    extra = [f" +{fmt_s(threads)}" if threads > 0 else "", f" +{fmt_s(front)} front" if front > 0 else ""]
    wordings = (f"{share} of a step" + (f"{extra[0]} CPU on its threads" if extra[0] else "") + extra[1],
                f"{share}" + (f"{extra[0]} threads" if extra[0] else "") + extra[1], share)
    return next((w for w in wordings if room is None or len(w) <= room), "")


class StatusHeader(Widget):
    """Three lines: state and progress; the config in force and the job; the newest warning, action or notice."""

    DEFAULT_CSS = """
    StatusHeader { height: 3; background: $panel; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    snapshot: reactive[Snapshot | None] = reactive(None)
    """The session as of the last tick."""
    action: reactive[str] = reactive("")
    """What the app is doing on the user's behalf (stopping, a control answer)."""
    replay: reactive[dict] = reactive(dict, always_update=True)
    """A replay's transport status (playing, speed, step)."""

    def __init__(self, mode: str, recording: str | None, total_steps: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.mode, self.recording, self.total_steps = mode, recording, total_steps

    def render(self) -> Text:
        snap = self.snapshot or Snapshot()
        wide = self.size.width >= 120
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append_text(self._first_line(snap, wide, self.size.width))
        out.append("\n")
        out.append_text(self._second_line(snap, wide))
        out.append("\n")
        out.append_text(self._third_line(snap))
        return out

    def _first_line(self, snap: Snapshot, wide: bool, width: int | None = None) -> Text:
        """`width`: the columns to fit (None: no limit); only ddptop's cost gives way, never the recording's name."""
        out = Text()
        live = self.mode != "replay"
        out.append(" LIVE " if live else " REPLAY ", style="bold reverse " + (palette.GREEN if live else palette.SKY))
        word, style = run_state(snap, self.mode, self.replay)
        out.append(f" {word}", style=f"bold {style}")
        steps = self.total_steps or getattr(snap.run, "total_steps", 0)  # replays: the recorded run's plan
        out.append(f" · step {snap.step}{f'/{steps}' if steps else ''} · {'epoch ' if wide else 'ep '}{snap.epoch}")
        sweep = getattr(snap.run, "sweep_segments", 0)  # a profile's sweep: which configuration of how many
        out.append(f" · segment {snap.segment}" + (f" (sweep {min(snap.segment + 1, sweep)}/{sweep})" if sweep else ""))
        if snap.paused and live:
            out.append(f" · {rate_unit(snap)} paused", style=palette.NOTE)
        elif not snap.finished:
            out.append(f" · {snap.images_per_s:,.0f} {rate_unit(snap)}")
            if snap.tokens_per_s > 0:  # the batches say how many tokens they hold
                out.append(f" {snap.tokens_per_s:,.0f} tokens/s")
        recording = self._recording()
        if wide and not snap.finished:  # the cost in the columns the recording's name leaves
            cost = own_cost(snap, None if width is None else width - len(out) - len(recording) - 6)
            if cost:
                out.append(f" · {cost}")
        out.append(" · ")
        out.append_text(recording)
        return out

    def _recording(self) -> Text:
        if self.mode == "replay":
            return Text(f"file {self.recording}" if self.recording else "file", style="dim")
        if self.recording:
            return Text(f"rec ● {clean(self.recording)}", style=VERMILLION)
        return Text("rec off", style="dim")

    def _second_line(self, snap: Snapshot, wide: bool) -> Text:
        out = Text()
        config = snap.config
        out.append(clean(tables.describe(config)) if config else "config: -", style=f"bold {palette.MARKER}")
        run = snap.run
        if run is None:
            out.append(" · waiting for rank 0 to describe the run", style="dim")
        else:
            params = f"{run.param_count / 1e6:.2f}M" if run.param_count >= 1e6 else f"{run.param_count / 1e3:.0f}k"
            out.append(f" · {clean(run.model)} ({params} params, {fmt_bytes(run.param_bytes)} of gradients) on "
                       f"{clean(run.dataset)}" if wide else f" · {clean(run.model)} on {clean(run.dataset)}")
        hosts = snap.hosts
        out.append(f" · {snap.world_size} ranks on {len(hosts)} host{'s' if len(hosts) != 1 else ''}")
        if wide:
            out.append(f" ({clean(', '.join(hosts[:4]))}{'…' if len(hosts) > 4 else ''}) · found by "
                       f"{clean(snap.rank_source)}")
        return out

    def _third_line(self, snap: Snapshot) -> Text:
        if snap.diverged:
            return Text(f"⚠ {clean(snap.diverged[-1].describe())}", style=f"bold {VERMILLION}")
        if self.action:
            return Text(clean(self.action), style="bold")
        return Text(clean(snap.notices[-1]) if snap.notices else "", style="dim")


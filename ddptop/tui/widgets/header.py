"""Provides the status header: model, data, ranks, hosts, config in force, step, img/s, recording, rank source."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.state.session import Snapshot
from ddptop.tui.render.units import fmt_bytes


def _config_text(config, wide: bool) -> str:
    if not config:
        return "config: -"
    if not wide:
        return (f"{config.get('strategy')} {config.get('bucket_mb', 0):g}MB async {'on' if config.get('async_op') else 'off'}"
                f" b{config.get('batch_size')} lr {config.get('lr', 0):g}")
    return (f"{config.get('strategy')}  bucket {config.get('bucket_mb', 0):g} MB  "
            f"async_op {'on' if config.get('async_op') else 'off'}  batch {config.get('batch_size')}/rank  "
            f"lr {config.get('lr', 0):g}")


class StatusHeader(Widget):
    """Three lines: what runs where, the config in force and progress, and the newest notice or action."""

    DEFAULT_CSS = """
    StatusHeader { height: 3; background: $panel; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    snapshot: reactive[Snapshot | None] = reactive(None)
    """The session as of the last tick."""
    action: reactive[str] = reactive("")
    """What the app is doing on the user's behalf (stopping, a control answer)."""

    def __init__(self, mode: str, recording: str | None, total_steps: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.mode, self.recording, self.total_steps = mode, recording, total_steps

    def render(self) -> Text:
        snap = self.snapshot or Snapshot()
        wide = self.size.width >= 120
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(" LIVE " if self.mode == "live" else " REPLAY ", style="bold reverse green" if self.mode == "live"
                   else "bold reverse cyan")
        run = snap.run
        params = f"{run.param_count / 1e6:.2f}M" if run and run.param_count >= 1e6 else f"{(run.param_count if run else 0) / 1e3:.0f}k"
        what = ((f" {run.model} ({params} params, {fmt_bytes(run.param_bytes)} of gradients) on {run.dataset}" if wide
                 else f" {run.model} {params} on {run.dataset}") if run else " waiting for rank 0 to describe the run")
        out.append(what, style="bold")
        hosts = snap.hosts
        out.append(f" · {snap.world_size} ranks on {len(hosts)} host{'s' if len(hosts) != 1 else ''}"
                   f" ({', '.join(hosts[:4])}{'…' if len(hosts) > 4 else ''}) · {'found by ' if wide else ''}"
                   f"{snap.rank_source}")
        out.append(" · rec ")
        out.append("● " + self.recording if self.recording else "off", style="red" if self.recording else "dim")
        out.append("\n")
        out.append(_config_text(snap.config, wide), style="yellow")
        steps = self.total_steps or getattr(snap.run, "total_steps", 0)  # replays: the recorded run's plan
        total = f"/{steps}" if steps else ""
        segment = snap.segments[-1].index if snap.segments else 0
        sweep = getattr(snap.run, "sweep_segments", 0)  # a profile's sweep: which configuration of how many
        progress = f" · sweep {min(segment + 1, sweep)}/{sweep}" if sweep else ""
        out.append(f" · {'segment' if wide else 'seg'} {segment}{progress} · step {snap.step}{total}"
                   f" {'epoch' if wide else 'ep'} {snap.epoch} · {snap.images_per_s:,.0f} img/s · ")
        stepping = any(r.last for r in snap.ranks)
        state = "finished" if snap.finished else "paused" if snap.paused else "running" if stepping else "starting"
        out.append(state, style={"running": "green", "paused": "yellow", "finished": "cyan"}.get(state, "dim"))
        out.append("\n")
        last = self.action or (snap.notices[-1] if snap.notices else "")
        out.append(last, style="bold" if self.action else "dim")
        return out

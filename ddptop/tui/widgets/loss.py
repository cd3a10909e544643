"""Provides the loss panel: loss per rank and mean, test accuracy, iteration time; a marker at every config change."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.state.session import Snapshot
from ddptop.tui.render.cells import wrap_items
from ddptop.tui.render.overview import markers as _markers
from ddptop.tui.render import palette
from ddptop.tui.render.palette import series_style
from ddptop.tui.render.plot import Series, line_plot
from ddptop.tui.render.units import fmt_s

MEAN_STYLE = "bold"  # the terminal's own foreground: the mean stands apart from every rank's colour


class LossPanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    LossPanel { height: 1fr; min-height: 20; padding: 0 1; }
    """

    snapshot: reactive[Snapshot | None] = reactive(None)
    """The session as of the last tick."""

    def render(self) -> Text:
        snap = self.snapshot or Snapshot()
        width, height = max(30, self.size.width), max(12, self.size.height)
        if not snap.history:
            return Text("no steps yet", style="dim")
        markers = _markers(snap)
        x_range = (min(d.step for h in snap.history.values() for d in h[:1]),
                   max([1, snap.step - 1] + [m.x for m in markers]))  # a switch just applied shows at the edge
        loss_h = max(4, (height - 3) * 5 // 10)
        iter_h = max(3, (height - 3) * 3 // 10)
        acc_h = max(3, height - 3 - loss_h - iter_h)
        ranks = [Series(f"r{r}", series_style(r), [(d.step, d.loss) for d in h]) for r, h in snap.history.items()]
        mean = Series("mean", MEAN_STYLE, snap.mean_loss())
        out = self._title("loss", [(s.label, s.style) for s in ranks] + [("mean", MEAN_STYLE)])
        out.append_text(line_plot(ranks + [mean], markers, width, loss_h, x_range=x_range))
        iters = [Series(f"r{r}", series_style(r), [(d.step, d.iter_s) for d in h if not d.sampled])
                 for r, h in snap.history.items()]
        out.append("\n")
        out.append_text(self._title("step time (sampled steps left out)", [(s.label, s.style) for s in iters]))
        out.append_text(line_plot(iters, markers, width, iter_h, fmt=fmt_s, x_range=x_range, y_range=(0.0, max(
            (y for s in iters for _, y in s.points), default=1.0))))
        out.append("\n")
        acc = Series("accuracy", series_style(2), [(p.step, p.accuracy * 100) for p in snap.evals], dots_only=True)
        last = f" (last {snap.evals[-1].accuracy:.0%}, loss {snap.evals[-1].test_loss:.4f})" if snap.evals else ""
        out.append_text(self._title(f"test accuracy %{last}", []))
        out.append_text(line_plot([acc], markers, width, acc_h, fmt=lambda v: f"{v:.0f}%", x_range=x_range,
                                  y_range=(0.0, 100.0)) if snap.evals else _no_eval(snap))
        return out

    def _title(self, name: str, legend: list[tuple[str, str]]) -> Text:
        items = [Text(name, style="bold")]
        for label, style in legend:
            items.append(Text("━ ", style=style).append(label, style="default"))
        items.append(Text("┊ config change", style=palette.MARKER))
        out = wrap_items(items, max(30, self.size.width))
        out.append("\n")
        return out


def _no_eval(snap: Snapshot) -> Text:
    """Why there is no accuracy to draw: the run says when it evaluates none (a custom loss, --no-eval), else the
    first evaluation is still to come."""
    why = snap.run.no_eval if snap.run is not None else ""
    if why:
        return Text(f"no test accuracy: {why}; the training loss above is this run's measure", style="dim")
    return Text("no evaluation yet: the first comes at the end of epoch 1", style="dim")

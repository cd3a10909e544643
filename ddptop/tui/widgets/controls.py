"""Provides the controls panel: strategy, bucket MB, shard unit, async_op, batch size, lr, scale_lr, accum, compress,
lr warm-up and Apply; every request is
checked here as rank 0 will check it (SyncConfig.changed), refusals inline; a preview of DDP's bucket layout.

The fields show the config in force; a field the user has changed keeps the user's text (an edit) until Apply, esc or
leaving the panel; a field nobody touched follows every change, from this screen or from `ddptop ctl`."""

from __future__ import annotations

from typing import Any, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Button, Input, Label, Select, Static, Switch

from ddptop.config import BUCKETED, SHARDED, STRATEGIES, ZERO, SyncConfig
from ddptop.control.commands import apply_changes
from ddptop.errors import DdptopError, UsageError
from ddptop.metrics.buckets import ddp_buckets
from ddptop.state.session import Snapshot
from ddptop.tui.messages import ApplyRequested, TuneRequested
from ddptop.safe import clean
from ddptop.tui.render.units import fmt_bytes
from ddptop.tui.widgets.number_input import NumberInput

FIELDS = ("strategy", "bucket", "unit", "async", "batch", "lr", "scale", "accum", "compress", "warmup", "apply", "tune")
COMPRESS_CHOICES = ("none", "fp16", "bf16", "powersgd:1", "powersgd:2", "powersgd:4")  # ctl sets any powersgd:R
INTRO = ("Change the running job; every rank switches at the same step. The fields show the config in force "
         "until you edit them; esc discards your edits. tab / ↑↓ move between fields; digits go into number fields "
         "(1-8 switch panels elsewhere); enter opens the strategy list, applies from a number field or Apply.")


def _number(text: str, kind: type, what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise UsageError(f"{what} must be {'a whole number' if kind is int else 'a number'}, got {text!r}") from None


def parse_form(strategy: Any, bucket: str, async_op: bool, batch: str, current: Mapping, lr: str | None = None,
               scale_lr: bool = False, accum: str | None = None, compress: Any = None,
               warmup: str | None = None, unit: str | None = None) -> tuple[dict[str, Any], SyncConfig]:
    """(the changes the form asks for, the config they give), checked as rank 0 checks them (apply_changes and
    SyncConfig.changed refuse a setting that means nothing for the strategy; a shard unit's spelling here, whether
    it names a module of the model rank 0's); UsageError: one line to show. The shard unit is zero2's and zero3's:
    sent only with them (its field is disabled for the others)."""
    if strategy not in STRATEGIES:
        raise UsageError("pick a strategy")
    wanted = {"strategy": strategy, "bucket_mb": _number(bucket, float, "bucket MB"), "async_op": bool(async_op),
              "batch_size": _number(batch, int, "batch size")}
    if lr is not None:
        wanted["lr"] = _number(lr, float, "learning rate")
    if accum is not None:
        wanted["accum"] = _number(accum, int, "accum")
    if compress is not None:
        wanted["compress"] = str(compress)
    if warmup is not None:
        wanted["lr_warmup_steps"] = _number(warmup, int, "lr warm-up steps")
    if unit is not None and strategy in SHARDED:
        wanted["shard_unit"] = unit.strip()
    known = {**SyncConfig().to_dict(), **current}  # a recording from before accum/compress: their defaults ran
    changes = {k: v for k, v in wanted.items() if known.get(k) != v}
    if wanted["async_op"] and "strategy" in changes:  # asked for with a new strategy: rank 0 would judge it, so do we
        changes["async_op"] = True
    if not changes:
        raise UsageError("nothing to change: that is the config in force")
    if scale_lr:
        changes["scale_lr"] = True
    try:
        base = SyncConfig(**{k: v for k, v in current.items() if k in SyncConfig.__dataclass_fields__})
    except (DdptopError, TypeError):
        base = SyncConfig()
    return changes, apply_changes(base, changes)


def form_text(config: Mapping) -> dict[str, Any]:
    """What each field shows for `config` (the config in force): field id → the widget's value."""
    return {"strategy": config.get("strategy", "ddp"), "bucket": f"{config.get('bucket_mb', 25):g}",
            "async": bool(config.get("async_op")), "batch": str(config.get("batch_size", 64)),
            "lr": f"{config.get('lr', 0.1):g}", "accum": str(config.get("accum", 1)),
            "compress": str(config.get("compress", "none")), "warmup": str(config.get("lr_warmup_steps", 0)),
            "unit": str(config.get("shard_unit", ""))}


class StrategySelect(Select, inherit_bindings=False):
    """Select without its ↑↓/space bindings (they reopened the list): ↑↓ move between fields as the panel says,
    space is the app's pause, enter opens the list."""

    BINDINGS = [Binding("enter", "show_overlay", "Strategy list", show=False)]


def bucket_preview(snap: Snapshot | None, bucket_mb: float) -> Text:
    """Gradient size and the buckets `bucket_mb` will give (DDP's reverse order), from the run's layer sizes."""
    run = snap.run if snap else None
    if run is None or not run.layers:
        return Text("bucket layout: waiting for rank 0 to describe the model", style="dim")
    per_param = run.param_bytes / run.param_count if run.param_count else 4.0
    buckets = ddp_buckets(run.layers, per_param, bucket_mb)
    out = Text(f"gradients {fmt_bytes(run.param_bytes)} in {run.param_tensors} tensors; at {bucket_mb:g} MB DDP "
               f"makes about {len(buckets)} bucket{'s' if len(buckets) != 1 else ''}", style="bold")
    if len(buckets) == 1:
        out.append(" (everything in one: no overlap with the backward pass is possible)", style="bold")
    out.append(", all-reduced in this order (the last layers first):")
    for i, b in enumerate(buckets[:8]):
        out.append(f"\n  bucket {i}: {fmt_bytes(b.nbytes)}  {clean(b.span())}")
    if len(buckets) > 8:
        out.append(f"\n  … {len(buckets) - 8} more")
    out.append("\n  (DDP's first step after a switch sends one bucket of everything; the timeline shows the real "
               "buckets)", style="dim")
    return out


class ControlsPanel(VerticalScroll, can_focus=False):
    DEFAULT_CSS = """
    ControlsPanel { height: 1fr; padding: 0 1; }
    ControlsPanel Horizontal { height: auto; }
    ControlsPanel #intro { margin-bottom: 0; }
    ControlsPanel Label { width: 16; }
    ControlsPanel .hint { width: auto; color: $text-muted; margin-left: 2; }
    ControlsPanel Input { width: 16; }
    ControlsPanel Input:focus { background: $accent; color: $text; text-style: bold; }
    ControlsPanel Switch { border: none; height: 1; padding: 0; }
    ControlsPanel Switch:focus { background: $accent; }
    ControlsPanel Select { width: 24; height: auto; }
    ControlsPanel Select:focus > SelectCurrent { background: $accent; text-style: bold; }
    ControlsPanel Button:focus { text-style: bold reverse; }
    ControlsPanel .switch-text { width: 4; margin-left: 1; }
    ControlsPanel #status { height: auto; }
    ControlsPanel #status.error { color: $error; }
    ControlsPanel #status.ok { color: $success; }
    ControlsPanel #preview, ControlsPanel #buckets { height: auto; margin-top: 1; }
    """
    BINDINGS = [Binding("up", "app.focus_previous", "Previous field", show=False),
                Binding("down", "app.focus_next", "Next field", show=False),
                Binding("escape", "leave", "Discard edits", key_display="esc")]

    status: reactive[str] = reactive("")
    """Inline outcome: an error, pending, applied at step k, or the segment now in force."""
    status_kind: reactive[str] = reactive("")
    """`error`, `ok` or empty: the status line's colour."""

    def __init__(self, enabled: bool, **kwargs):
        super().__init__(**kwargs)
        self.enabled = enabled
        self.current: dict[str, Any] = {}
        self.snapshot: Snapshot | None = None
        self._shown_segment: int | None = None
        self._shown: dict[str, Any] = {}  # field id → what it showed for the config in force (unedited)
        self.status_segment: int | None = None  # the segment the status line speaks of (an `applied` answer)

    def compose(self) -> ComposeResult:
        disabled = not self.enabled
        yield Static("Replay: the controls are disabled; they act on a live job." if disabled else INTRO, id="intro")
        yield Static("", id="status")  # above the form: the outcome stays in sight at 80×24
        rows = (("strategy", StrategySelect([(s, s) for s in STRATEGIES], allow_blank=False, value="ddp",
                                            id="strategy", disabled=disabled, compact=True), ""),
                ("bucket MB", NumberInput("25", id="bucket", disabled=disabled, compact=True), "ddp, zero1"),
                ("shard unit", Input("", id="unit", disabled=True, compact=True, placeholder="top-level blocks"),
                 "zero2, zero3: module classes or names (Linear,features.0)"),
                ("async_op", Switch(False, id="async", disabled=disabled, animate=False), "allreduce only"),
                ("batch size", NumberInput("64", id="batch", disabled=disabled, compact=True), "per rank"),
                ("lr", NumberInput("0.1", id="lr", disabled=disabled, compact=True), "learning rate"),
                ("scale_lr", Switch(False, id="scale", disabled=disabled, animate=False),
                 "lr follows the batch size (linear scaling) unless lr is changed too"),
                ("accum", NumberInput("1", id="accum", disabled=disabled, compact=True),
                 "micro-steps per step (gradient accumulation)"),
                ("compress", StrategySelect([(c, c) for c in COMPRESS_CHOICES], allow_blank=False, value="none",
                                            id="compress", disabled=disabled, compact=True),
                 "gradients on the wire; powersgd: ddp only"),
                ("lr warm-up", NumberInput("0", id="warmup", disabled=disabled, compact=True),
                 "steps of gradual warm-up (0: off)"))
        for label, field, hint in rows:
            with Horizontal():
                yield Label(label)
                yield field
                if isinstance(field, Switch):
                    yield Static("off", id=f"{field.id}-text", classes="switch-text")
                yield Static(hint, classes="hint")
        with Horizontal():
            yield Button("Apply", id="apply", variant="primary", disabled=disabled, compact=True)
            yield Button("Tune buckets", id="tune", disabled=disabled, compact=True)
            yield Static("DDP: try the what-if model's best bucket sizes, keep the fastest", classes="hint")
        yield Static("", id="preview")
        yield Static("", id="buckets")

    def show_config(self, snap: Snapshot) -> None:
        """Follow the config in force when a new segment starts: every field the user has not edited takes its value,
        and (live) the status line says what changed unless it already speaks of that segment."""
        self.snapshot = snap
        config = snap.config
        self.current = dict(config)
        if snap.segment == self._shown_segment or not config:
            return
        first = self._shown_segment is None
        self._shown_segment = snap.segment
        self._fill(config, keep_edits=True)
        if self.enabled and not first and snap.segments and snap.segment != self.status_segment:
            seg = snap.segments[-1]
            self.status, self.status_kind = (f"now in force from step {seg.step}: {seg.label()} (segment {seg.index}, "
                                              f"asked by {seg.who})"), ""
            self.status_segment = seg.index
        self.refresh_preview()

    def _fill(self, config: Mapping, keep_edits: bool) -> None:
        """Show `config` in the fields; with keep_edits, a field whose value differs from what it last showed for the
        config in force (the user changed it) keeps it. scale_lr is a request, not a setting: off once no edit is
        left."""
        shown = form_text(config)
        if shown["compress"] not in COMPRESS_CHOICES:  # a powersgd:R that `ddptop ctl` set
            self.query_one("#compress", Select).set_options([(c, c) for c in (*COMPRESS_CHOICES, shown["compress"])])
        for key, value in shown.items():
            field = self.query_one(f"#{key}")
            if not (keep_edits and key in self._shown and field.value != self._shown[key]):
                field.value = value
        self._shown = shown
        if all(self.query_one(f"#{key}").value == value for key, value in shown.items()):  # no edit left
            self.query_one("#scale", Switch).value = False

    def discard(self) -> None:
        """Drop every edit: the fields show the config in force again (an error about the edit goes with it)."""
        if not self.enabled or not self.current:
            return
        self._fill(self.current, keep_edits=False)
        if self.status_kind == "error":
            self.status, self.status_kind = "", ""
        self.refresh_preview()

    def read(self, current: Mapping) -> tuple[dict[str, Any], SyncConfig]:
        q = self.query_one
        return parse_form(q("#strategy", Select).value, q("#bucket", Input).value, q("#async", Switch).value,
                          q("#batch", Input).value, current, q("#lr", Input).value, q("#scale", Switch).value,
                          q("#accum", Input).value, q("#compress", Select).value, q("#warmup", Input).value,
                          q("#unit", Input).value)

    def refresh_preview(self) -> None:
        """What Apply would send, checked now; and for DDP the bucket layout the size gives."""
        preview, buckets = self.query_one("#preview", Static), self.query_one("#buckets", Static)
        if not self.enabled or not self.current:
            preview.update("")
        else:
            try:
                changes, config = self.read(self.current)
                preview.update(Text(f"Apply sends {changes}: the job will run {config.describe()} lr={config.lr:g}",
                                    style="dim"))
            except UsageError as exc:
                preview.update(Text(str(exc), style="dim"))
        try:
            bucket_mb = float(self.query_one("#bucket", Input).value)
        except ValueError:
            bucket_mb = 0.0
        strategy = self.query_one("#strategy", Select).value
        buckets.update(bucket_preview(self.snapshot, bucket_mb) if strategy in BUCKETED and bucket_mb > 0 else "")

    def action_leave(self) -> None:
        """Out of the form, edits discarded: the fields show what is in force, digits switch panels again."""
        self.discard()
        self.app.set_focus(None)

    def watch_status(self, text: str) -> None:
        self.query_one("#status", Static).update(clean(text))

    def watch_status_kind(self, kind: str) -> None:
        status = self.query_one("#status", Static)
        status.set_class(kind == "error", "error")
        status.set_class(kind == "ok", "ok")

    def on_switch_changed(self, event: Switch.Changed) -> None:
        self.query_one(f"#{event.switch.id}-text", Static).update("on" if event.value else "off")
        self.refresh_preview()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "strategy" and event.value != "allreduce":  # async_op is allreduce's: leaving it
            self.query_one("#async", Switch).value = False  # turns it off (as SyncConfig.changed)
        compress = self.query_one("#compress", Select)
        if event.select.id == "strategy" and (event.value in ("single", *ZERO) or (
                event.value != "ddp" and str(compress.value).startswith("powersgd"))):
            compress.value = "none"  # a compression the strategy cannot carry ends with it (SyncConfig.changed)
        if event.select.id == "strategy":  # the shard unit is FSDP2's: typed only for zero2 and zero3
            self.query_one("#unit", Input).disabled = not (self.enabled and event.value in SHARDED)
        self.refresh_preview()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.refresh_preview()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            event.stop()
            self.submit()
        elif event.button.id == "tune" and self.enabled:
            event.stop()
            self.status, self.status_kind = "tune bucket: asking the job …", ""
            self.post_message(TuneRequested())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def submit(self) -> None:
        """Check the form here (inline error, nothing sent) and ask the app to send what changed."""
        if not self.enabled:
            return
        try:
            changes, _ = self.read(self.current)
        except UsageError as exc:
            self.status, self.status_kind = str(exc), "error"
            return
        self.status, self.status_kind = f"checking {changes} against the job …", ""
        self.post_message(ApplyRequested(changes))

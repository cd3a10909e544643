"""The pure renderables, read as text: slurm graph, Gantt chart, breakdown bar, sparklines, plots, tables."""

from __future__ import annotations

import pytest
from rich.console import Console

from ddptop.events import NicStat, Span
from ddptop.state.session import SessionState
from ddptop.tui.render.breakdown import breakdown_bar, breakdown_legend, span_parts
from ddptop.tui.render.gantt import gantt
from ddptop.tui.render.plot import Marker, Series, line_plot
from ddptop.tui.render.slurm import slurm_graph, slurm_stats
from ddptop.tui.render.spark import pct_bar, sparkline
from ddptop.tui.render.tables import ranks_table, util_rows
from ddptop.tui.render.units import fmt_bytes, fmt_rate, fmt_s


def _plain(renderable, width=160) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


def test_units():
    assert (fmt_bytes(83944), fmt_bytes(288.813e9, 3), fmt_bytes(None)) == ("83.9 KB", "288.813 GB", "-")
    assert (fmt_rate(4700), fmt_rate(89.33e6), fmt_rate(0)) == ("4.70 KB/s", "89.33 MB/s", "0.00 KB/s")
    assert (fmt_s(1.5), fmt_s(0.041), fmt_s(0.0031), fmt_s(0.00035)) == ("1.50 s", "41 ms", "3.1 ms", "350 µs")


def test_slurm_graph_grows_rx_up_and_tx_down_newest_on_the_right():
    lines = slurm_graph([0, 5, 10], [10, 0, 0], width=5, height=5).plain.split("\n")
    assert lines == ["    X", "   XX", "─────", "  X  ", "  X  "]


def test_slurm_graph_shows_any_traffic_as_at_least_one_x():
    lines = slurm_graph([1, 1000], [0, 0], width=2, height=7).plain.split("\n")
    assert lines[2] == "XX" and lines[0] == " X" and set("".join(lines[4:])) == {" "}


def test_slurm_stats_has_slurms_seven_lines():
    nic = NicStat("eth0", 4700, 630, 288_813_000_000, 287_709_000_000, 34538632, 8770909, 0, 2, 0, 0, 5790, 2060)
    text = slurm_stats(nic, [1000, 5790], [630, 2060], width=100).plain.split("\n")
    assert text[0].startswith("Active Interface: eth0") and "Current TX Speed: 0.63 KB/s" in text[1]
    assert "Graph Top RX Speed: 5.79 KB/s" in text[2] and "Overall Top TX Speed: 2.06 KB/s" in text[3]
    assert "Received Packets: 34538632" in text[4] and "GBytes Received: 288.813 GB" in text[5]
    assert "Errors on Transmission: 2" in text[6]
    assert text[0].endswith("Interface Speed: unknown")  # nothing says this NIC's rate


def test_slurm_stats_says_a_known_link_rate_and_the_share_in_use():
    """53.75 MB/s each way is 430 Mbit/s: 43% of the lab's 1 Gbit/s link, whichever direction is busier."""
    nic = NicStat("veth0", 12e6, 53.75e6, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1e9, "shaped by ddptop lab")
    line = slurm_stats(nic, [1], [1], width=120).plain.split("\n")[0]
    assert line.endswith("Interface Speed: 1.0 Gbit/s (shaped by ddptop lab), in use 43%")
    nic = NicStat("eth0", 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 25e9, "reported by the NIC")
    assert "Interface Speed: 25.0 Gbit/s (reported by the NIC), in use 0%" in slurm_stats(nic, [1], [1], 120).plain


def _spans():
    return (Span("data", "data", 0.0, 0.01), Span("fwd", "features.0", 0.01, 0.02), Span("bwd", "features.0", 0.03, 0.03),
            Span("comm", "bucket 0", 0.04, 0.04), Span("opt", "optimizer", 0.08, 0.02))


def test_gantt_draws_lanes_layers_and_collectives_on_one_time_axis():
    lines = gantt(_spans(), width=18 + 10, height=10, iter_s=0.1).plain.split("\n")
    names = [line[:18].strip() for line in lines[1:]]
    assert names == ["compute", "comm", "overlap", "features.0", "bucket 0"]
    cells = {name: line[18:] for name, line in zip(names, lines[1:])}
    assert cells["comm"] == "····████··" and cells["compute"] == "░██▓▓▓··≡≡"  # each part its own glyph
    assert cells["overlap"] == "····▀▀····"  # backward (0.03-0.06) under the bucket (0.04-0.08)
    assert cells["features.0"] == "·██▓▓▓····"


def test_gantt_counts_rows_that_do_not_fit():
    many = _spans() + tuple(Span("comm", f"allreduce p{i}", 0.05, 0.01) for i in range(20))
    lines = gantt(many, width=40, height=8).plain.split("\n")
    assert len(lines) == 8 and "more rows" in lines[-1]


def test_breakdown_parts_and_bar():
    parts, overlap = span_parts(_spans(), iter_s=0.1)
    assert dict(parts) == pytest.approx({"data": 0.01, "forward": 0.02, "backward": 0.03, "exposed comm": 0.02,
                                         "optimizer": 0.02})
    assert overlap == pytest.approx(0.5)  # half of the 40 ms bucket ran beside backward
    bar = breakdown_bar(parts, 10).plain.split("\n")
    assert bar[0] == "░██▓▓▓╳╳≡≡" and "╳ exposed comm 20 ms 20%" in "\n".join(bar[1:])
    assert len(breakdown_bar([("data", 1.0)], 20, legend=False, scale=2.0).plain) == 10


def test_the_bar_of_a_step_adds_up_to_its_step_time_and_wait_is_not_communication():
    from ddptop.events import StepDone
    from ddptop.tui.render.breakdown import step_parts

    done = StepDone(0, 5, 0, 0, 0.0, 0.100, 0.010, 0.060, 0.030, 0.020, 0.3, 16, 1.0, 0, 0, 0, False,
                    fwd_s=0.020, bwd_s=0.030, opt_s=0.010, own_s=0.004)
    # each segment of the bar is the field it names; `other` is what is left (0.1 - 0.094 s)
    assert dict(step_parts(done)) == pytest.approx({"data": 0.010, "forward": 0.020, "backward": 0.030,
                                                    "exposed comm": 0.020, "optimizer": 0.010, "ddptop": 0.004,
                                                    "other": 0.006})
    waited = _spans() + (Span("wait", "wait p0", 0.08, 0.01),)
    assert dict(span_parts(waited, 0.1)[0])["exposed comm"] == pytest.approx(0.02)


def test_legends_wrap_between_items_never_inside_one():
    legend = breakdown_legend({"data": 0.01, "forward": 0.02, "backward": 0.03, "exposed comm": 0.02,
                               "optimizer": 0.02, "ddptop": 0.001, "other": 0.005}, width=40).plain.split("\n")
    assert len(legend) > 1 and all(len(line) <= 40 for line in legend)
    for line in legend:
        for item in line.split("  "):
            assert item[:2] in ("░ ", "█ ", "▓ ", "╳ ", "≡ ", "• ", "· "), line


def test_sparkline_and_bar():
    assert sparkline([0, 50, 100], 5, top=100).plain == "  ▁▅█"
    assert pct_bar(50, 12).plain == "[|||||  50%]"
    assert pct_bar(None, 7).plain == "[  -  ]"


def test_line_plot_marks_config_changes_with_labels():
    series = [Series("r0", "cyan", [(s, 2.0 - s / 100) for s in range(200)])]
    lines = line_plot(series, [Marker(100, "ddp 10MB")], width=48, height=6).plain.split("\n")
    assert len(lines) == 6 and lines[0].startswith("      2┤")
    assert "┊ddp 10MB" in lines[0] and sum("┊" in line for line in lines[1:-1]) >= 3
    assert lines[-1].split() == ["0", "100", "199"]
    assert "no data yet" in line_plot([], [], 40, 5).plain


def test_tables_show_every_rank_and_the_slowest(events):
    state = SessionState()
    state.apply_all(events[:300])
    snap = state.snapshot()
    text = _plain(ranks_table(snap, width=160))
    assert "rank" in text and "mean10" in text and "ddptop" in text and "GPU%" in text
    assert text.count("running") == 2 and "◀ slowest" in text
    narrow = _plain(ranks_table(snap, width=80), width=80)
    assert "GPU%" not in narrow and "running ◀" in narrow and "mean10" in narrow
    util = util_rows(snap, 120).plain
    assert "r0" in util and "r1" in util and "CPU [" in util and "GPU -" in util


def test_a_shared_or_unexplained_counter_is_not_compared_with_the_formulas():
    from ddptop.metrics.traffic import not_comparable

    assert "shared by every process" in not_comparable("lo", 1000, 1000)
    assert not_comparable("eth0", 1.05e6, 1e6) == ""  # TCP/IP headers and telemetry: a few percent
    assert "other traffic" in not_comparable("eth0", 5e6, 1e6)  # 5× what the ranks send: someone else's


def test_gpu_text_shows_whatever_the_gpu_reports_and_fields_added_later():
    import dataclasses

    from ddptop.events import GpuStat, SystemSample
    from ddptop.state.views import RankView
    from ddptop.tui.render.tables import gpu_text

    # a field a later GpuStat might add: shown by its unit suffix without a change to the renderer
    Newer = dataclasses.make_dataclass("Newer", [("decoder_bytes_s", float, None)], bases=(GpuStat,), frozen=True)
    gpu = Newer(0, "H100", 80.0, 10_000_000_000, 80_000_000_000, 300.0, 61.0,
                sm_clock_mhz=1980.0, pcie_tx_bytes_s=12e9, decoder_bytes_s=3e9)

    def sample(g):
        return SystemSample(0, "a", 0.0, 1.0, 1.0, 1, 1, 2, "eth0", (), (g,), "ok")

    text = gpu_text(RankView(0, system=sample(gpu)), None).plain
    for words in ("80%", "mem 10 GB/80 GB", "power 300 W", "temp 61°C", "sm clock 1980 MHz", "pcie tx 12.0 GB/s",
                  "decoder 3.0 GB/s"):
        assert words in text, text
    bare = gpu_text(RankView(0, system=sample(GpuStat(0, "MIG", None, None, None, None, None))), None).plain
    assert bare.startswith("GPU [") and "W" not in bare
    assert gpu_text(RankView(0), None).plain == "GPU -"


def test_a_step_from_before_compute_was_split_still_adds_up():
    from ddptop import metrics
    from ddptop.events import StepDone

    old = StepDone(0, 5, 0, 0, 0.0, 1.6, 0.001, 1.45, 0.4, 0.10, 0.6, 64, 1.0, 0, 0, 0, False)  # schema-1 file
    parts = metrics.parts(old)
    assert list(parts) == ["data", "compute", "exposed comm", "ddptop", "other"]
    assert parts == pytest.approx({"data": 0.001, "compute": 1.45, "exposed comm": 0.10, "ddptop": 0.0,
                                   "other": 0.049})  # 1.6 - 0.001 - 1.45 - 0.10
    assert metrics.mean_parts([old, old]) == pytest.approx(parts)


def test_a_host_name_with_a_lone_surrogate_and_control_characters_is_shown_escaped():
    """The screen cleans names with safe.clean, the project's one sanitizer: C0/C1 controls, bidi overrides and lone
    surrogates (bytes that were not UTF-8: a terminal cannot show one, and it breaks encoding the frame) come out as
    escapes, whichever path the name took to the screen (here straight into the state, before any decoder)."""
    import io

    from ddptop.events import RankJoined

    state = SessionState()
    state.apply_all([RankJoined(r, 2, "node\ud800\x1b]0;owned\x07\u202e7", 1, "cpu", "gloo", 1, "2", "0.1", "flags",
                                0.0) for r in (0, 1)])
    snap = state.snapshot()
    shown = {}
    for name, renderable in (("ranks", ranks_table(snap, width=160)), ("util", util_rows(snap, 160))):
        console = Console(width=160, record=True, file=io.StringIO())
        console.print(renderable)
        shown[name] = text = console.export_text()
        assert not any("\ud800" <= c <= "\udfff" or (ord(c) < 0x20 and c != "\n") or c in "\x7f\u202e"
                       for c in text), ascii(text)
    assert shown["ranks"].count("node\\ud800\\x1b]0;owned\\x07\\u202e7") == 2, shown["ranks"]
    assert shown["util"].count("node\\ud800") == 2, shown["util"]  # the utilisation rows cut the host to 10


def test_tokens_per_s_shows_beside_the_rate_where_the_steps_carry_tokens(events):
    """Issue 44: each step of the fixture given 10 tokens a sample (the test's own count): the header shows tokens/s
    beside the rate, ten times it (the same steps over the same time); without tokens it shows none. The screen's
    segment table keeps its columns (a tokens/s column squeezed every other at 160 columns: info and the report
    carry it), so it reads the same either way."""
    import dataclasses

    from ddptop.events import StepDone
    from ddptop.tui.render.tables import segment_table
    from ddptop.tui.widgets.header import StatusHeader

    def shown(stream):
        state = SessionState()
        state.apply_all(stream)
        snap = state.snapshot()
        return snap, StatusHeader("replay", None)._first_line(snap, True).plain, _plain(segment_table(snap, 160))

    said = [dataclasses.replace(e, tokens=10 * e.batch_size) if isinstance(e, StepDone) else e for e in events[:300]]
    snap, header, table = shown(said)
    assert snap.tokens_per_s == pytest.approx(10 * snap.images_per_s) and snap.images_per_s > 0
    assert f" {snap.images_per_s:,.0f} img/s {snap.tokens_per_s:,.0f} tokens/s" in header, header
    plain, header, plain_table = shown(events[:300])
    assert "tokens/s" not in header and plain_table == table and "…" not in table

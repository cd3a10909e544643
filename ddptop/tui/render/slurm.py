"""Provides the slurm-style network graph (RX columns of `X` growing up, TX growing down) and its stats block."""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

from ddptop.events import NicStat
from ddptop.metrics.expected import formula
from ddptop.state.views import NodeView
from ddptop.metrics.traffic import SHARED_IFACES, not_comparable
from ddptop.tui.render import palette
from ddptop.safe import clean
from ddptop.tui.render.units import fmt_bits, fmt_bytes, fmt_count, fmt_rate


def _heights(values: Sequence[float], top: float, rows: int) -> list[int]:
    """Rows of `X` per column: any traffic shows at least one, like slurm's idle line."""
    if top <= 0:
        return [0] * len(values)
    return [min(rows, max(1 if v > 0 else 0, int(round(v / top * rows)))) for v in values]


def slurm_graph(rx: Sequence[float], tx: Sequence[float], width: int, height: int) -> Text:
    """RX above the middle line, TX below it; one column per sample, newest on the right.

    Each half is scaled to its own graph top (the largest rate in view), as slurm does.
    """
    width, height = max(1, width), max(3, height)
    rx, tx = list(rx)[-width:], list(tx)[-width:]
    up, down = (height - 1) // 2, height - 1 - (height - 1) // 2
    rx_h = _heights(rx, max(rx, default=0.0), up)
    tx_h = _heights(tx, max(tx, default=0.0), down)
    pad_rx, pad_tx = width - len(rx_h), width - len(tx_h)
    lines = []
    for row in range(up):  # row 0 is the top: a column reaches it when its height is `up`
        need = up - row
        lines.append(Text(" " * pad_rx + "".join("X" if h >= need else " " for h in rx_h), style=palette.RX))
    lines.append(Text("─" * width, style="dim"))
    for row in range(down):
        need = row + 1
        lines.append(Text(" " * pad_tx + "".join("X" if h >= need else " " for h in tx_h), style=palette.TX))
    return Text("\n").join(lines)


def slurm_stats(nic: NicStat, rx: Sequence[float], tx: Sequence[float], width: int = 80) -> Text:
    """slurm's seven lines: interface, current / graph-top / overall-top speeds, packets, GB, errors."""
    rows = [
        (f"Active Interface: {clean(nic.iface)}", f"Interface Speed: {speed_text(nic)}"),
        (f"Current RX Speed: {fmt_rate(nic.rx_rate)}", f"Current TX Speed: {fmt_rate(nic.tx_rate)}"),
        (f"Graph Top RX Speed: {fmt_rate(max(rx, default=0.0))}", f"Graph Top TX Speed: {fmt_rate(max(tx, default=0.0))}"),
        (f"Overall Top RX Speed: {fmt_rate(nic.peak_rx_rate)}", f"Overall Top TX Speed: {fmt_rate(nic.peak_tx_rate)}"),
        (f"Received Packets: {nic.rx_packets}", f"Transmitted Packets: {nic.tx_packets}"),
        (f"GBytes Received: {nic.rx_bytes / 1e9:.3f} GB", f"GBytes Transmitted: {nic.tx_bytes / 1e9:.3f} GB"),
        (f"Errors on Receiving: {nic.rx_errors}", f"Errors on Transmission: {nic.tx_errors}"),
    ]
    left = min(max(len(a) for a, _ in rows) + 2, max(10, width // 2))
    out = Text()
    for i, (a, b) in enumerate(rows):
        if i:
            out.append("\n")
        out.append(a.ljust(left)[:left], style=palette.RX if "RX" in a or "Received" in a else "")
        out.append(b[: max(0, width - left)], style=palette.TX if "TX" in b or "Transmi" in b else "")
    return out


def speed_text(nic: NicStat) -> str:
    """`1.0 Gbit/s (shaped by ddptop lab), in use 43%`: the share is the busier direction's rate over the link's
    rate (each way; full duplex); `unknown` where nothing says the rate."""
    if nic.speed_bits_per_s is None:
        return "unknown"
    used = 8 * max(nic.rx_rate, nic.tx_rate) / nic.speed_bits_per_s
    return f"{fmt_bits(nic.speed_bits_per_s)} ({clean(nic.speed_by)}), in use {used:.0%}"


def nic_summary_line(host: str, nic: NicStat, width: int) -> str:
    """One node in the all-nodes table: host, interface, rates, totals, packets, errors."""
    text = (f"{clean(host):<14.14} {clean(nic.iface):<6.6} RX {fmt_rate(nic.rx_rate):>12} TX {fmt_rate(nic.tx_rate):>12}  "
            f"in {nic.rx_bytes / 1e9:8.3f} GB out {nic.tx_bytes / 1e9:8.3f} GB  "
            f"pkts {fmt_count(nic.rx_packets)}/{fmt_count(nic.tx_packets)}  err {nic.rx_errors + nic.tx_errors}")
    return text[:width]


def expected_line(node: NodeView, iface: str, strategy: str, short: bool = False) -> Text:
    """Bytes per step the node's ranks should send (the sum over them, by the formulas) beside what its NIC counted;
    on a shared counter (lo, or one moving more than the job explains) it says why there is no comparison."""
    nic = node.nic(iface)
    ranks = ", ".join(map(str, node.ranks))
    whose = f"rank{'s' if len(node.ranks) != 1 else ''} {ranks}"
    if short:
        out = Text("expected ", style="bold")
        same = node.expected_tx == node.expected_rx
        out.append(f"{fmt_bytes(node.expected_tx, 0)}/step each way" if same else
                   f"TX {fmt_bytes(node.expected_tx, 0)} RX {fmt_bytes(node.expected_rx, 0)}/step", style=palette.TX)
        out.append(f" (Σ {whose})")
    else:
        out = Text("per step  expected ", style="bold")
        out.append(f"TX {fmt_bytes(node.expected_tx)} RX {fmt_bytes(node.expected_rx)}", style=palette.TX)
        out.append(f" (sum over {whose}: {formula(strategy)}, S = gradient bytes)")
    counted = nic.per_step_tx if nic is not None else None
    why = not_comparable(iface, counted, node.expected_tx)
    if why and short:
        out.append(f"  NIC: no comparison ({f'{iface} shared' if iface in SHARED_IFACES else 'other traffic'})",
                   style="dim")
    elif why:
        out.append(f"  NIC: no comparison: {why}", style="dim")
    elif counted is not None:
        out.append(f"  NIC counted TX {fmt_bytes(counted)} RX {fmt_bytes(nic.per_step_rx)}", style=palette.RX)
        if node.expected_tx:
            out.append(f" ({(counted - node.expected_tx) / node.expected_tx:+.0%})")
    else:
        out.append("  NIC: not enough samples yet", style="dim")
    return out

"""Provides short human formats for bytes, rates, durations and percentages (one table of units)."""

from __future__ import annotations

_BYTE_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"))


def fmt_bytes(n: float | None, digits: int = 1) -> str:
    """`83.9 KB`; decimal units, as NIC tools and the README's formulas use."""
    if n is None:
        return "-"
    for scale, unit in _BYTE_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(bps: float | None) -> str:
    """`4.70 KB/s`, `89.33 MB/s`: two decimals like slurm."""
    if bps is None:
        return "-"
    for scale, unit in _BYTE_UNITS[1:]:
        if abs(bps) >= scale:
            return f"{bps / scale:.2f} {unit}/s"
    return f"{bps / 1e3:.2f} KB/s"


def fmt_bits(bits_per_s: float) -> str:
    """`1.0 Gbit/s`, `100 Mbit/s`: a link's rate, in the unit links are rated in."""
    for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:.1f} {unit}" if bits_per_s < 100 * scale else f"{bits_per_s / scale:.0f} {unit}"
    return f"{bits_per_s:.0f} bit/s"


def fmt_s(seconds: float | None) -> str:
    """`41 ms`, `1.02 s`, `350 µs`."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def fmt_count(n: int | float | None) -> str:
    """`34538632` → `34.5M`."""
    if n is None:
        return "-"
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def ellipsize(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"

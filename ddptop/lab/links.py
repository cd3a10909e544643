"""Link rates: parsing `--link` ("100mbit", "2.5gbit", "unlimited") and the tbf settings that shape a veth to it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddptop.errors import UsageError

_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)
MIN_RATE, MAX_RATE = 100e3, 100e9  # tbf's timers make sense in between; beyond 100 Gbit/s: use `unlimited`
# 1 ms of tokens: TCP sizes its segments to ~1 ms of its rate, so they pass whole (64 KB at 1 Gbit/s); a smaller
# bucket makes tbf split them, which costs more CPU than 2 cores have at 1 Gbit/s (486 Mbit/s with 0.1 ms)
BURST_S = 0.001
MIN_BURST = 3028  # two full Ethernet frames: the smallest bucket that passes a frame without stalling
QUEUE_S = 0.02  # a 20 ms queue behind the link, like a switch port's buffer
MIN_QUEUE = 64 * 1024


@dataclass(frozen=True)
class Link:
    """A full-duplex link: `bits_per_s` each way, None when the lab leaves it unshaped."""

    bits_per_s: float | None

    @property
    def bytes_per_s(self) -> float | None:
        return None if self.bits_per_s is None else self.bits_per_s / 8

    def describe(self) -> str:
        if self.bits_per_s is None:
            return "unlimited"
        for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
            if self.bits_per_s >= scale:
                return f"{self.bits_per_s / scale:g} {unit}"
        return f"{self.bits_per_s:g} bit/s"

    def tbf(self) -> list[str]:
        """`tc qdisc ... root tbf` arguments: rate, bucket (burst) and queue (limit) in bytes."""
        assert self.bits_per_s is not None
        rate = self.bits_per_s / 8
        burst = max(int(rate * BURST_S), MIN_BURST)
        limit = max(int(rate * QUEUE_S), MIN_QUEUE, 2 * burst)
        return ["tbf", "rate", f"{int(self.bits_per_s)}bit", "burst", str(burst), "limit", str(limit)]

    @property
    def burst_bytes(self) -> int:
        """Bytes that may pass at once before the rate applies (a transfer's time is ≥ (bytes − burst) / rate)."""
        return 0 if self.bits_per_s is None else max(int(self.bits_per_s / 8 * BURST_S), MIN_BURST)


def parse_link(text: str) -> Link:
    """"1gbit" → Link(1e9); "unlimited" → Link(None); anything else is a UsageError (exit 2)."""
    if text.strip().lower() in ("unlimited", "none"):
        return Link(None)
    match = _RATE.match(text)
    if not match:
        raise UsageError(f"--link: expected a rate like 100mbit, 2.5gbit, 10gbit or unlimited, got {text!r}")
    bits = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not MIN_RATE <= bits <= MAX_RATE:
        raise UsageError(f"--link: {text!r} is outside 100kbit..100gbit (or use unlimited)")
    return Link(bits)

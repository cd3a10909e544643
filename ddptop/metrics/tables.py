"""The per-segment table as text: one layout for `ddptop info`, the headless run's closing lines and the screen."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from ddptop.metrics import SegmentFigures, table_rows

HEADER = ("#", "steps", "config", "s/step slowest", "s/step mean", "img/s", "s/epoch", "compute", "comm", "exposed",
          "overlap", "ddptop", "MB/step", "loss")


def describe(config: Mapping[str, Any]) -> str:
    """A configuration as users read it: only the settings that mean something for its strategy."""
    from ddptop.config import SyncConfig
    from ddptop.errors import DdptopError

    try:
        return f"{SyncConfig(**config).describe()} lr={config.get('lr', '?'):g}"
    except (DdptopError, TypeError, ValueError):
        return " ".join(f"{k}={v}" for k, v in config.items()) or "(unknown)"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


TOKENS = "tokens/s"  # a column after the rate, only where some segment's batches said their tokens


def has_tokens(rows: Iterable[dict[str, Any]]) -> bool:
    """Whether a table of these rows carries the tokens/s column (some batch said how many tokens it held)."""
    return any(row.get("tokens_per_s", 0) > 0 for row in rows)


def cells(row: dict[str, Any], tokens: bool = False) -> tuple[str, ...]:
    """One segment's row (a `metrics.table_rows` row) as text cells under HEADER (`tokens`: with tokens/s)."""
    loss = row["final_loss"]
    said = row.get("tokens_per_s", 0)
    return (str(row["segment"]), f"{row['first_step']}-{row['last_step']}", describe(row["config"]),
            f"{row['step_s_slowest']:.3f}", f"{row['step_s_mean']:.3f}", f"{row['images_per_s']:.0f}",
            *((f"{said:.0f}" if said > 0 else "-",) if tokens else ()),
            f"{row['epoch_s']:.1f}" if row.get("epoch_s") else "-",
            _ms(row["compute_s"]), _ms(row["comm_s"]), _ms(row["exposed_comm_s"]), f"{row['overlap']:.0%}",
            f"{_ms(row['ddptop_s'])} {row['ddptop_share']:.1%}", f"{row['sent_mb']:.1f}",
            "nan" if math.isnan(loss) else f"{loss:.4f}")


def header(unit: str = "img/s", tokens: bool = False) -> tuple[str, ...]:
    """HEADER with the run's rate unit (metrics.rate_unit), and tokens/s after it with `tokens`."""
    out = [unit if name == "img/s" else name for name in HEADER]
    return tuple(out[:6] + [TOKENS] + out[6:] if tokens else out)


def lines(segments: Iterable[SegmentFigures], indent: str = "", unit: str = "img/s") -> list[str]:
    """The table, aligned, and one line saying which steps it counts."""
    return row_lines(table_rows(segments), indent, unit)


def row_lines(rows: list[dict[str, Any]], indent: str = "", unit: str = "img/s") -> list[str]:
    """`lines` for rows already made by `metrics.table_rows`."""
    if not rows:
        return []
    tokens = has_tokens(rows)
    body = [header(unit, tokens), *(cells(r, tokens) for r in rows)]
    widths = [max(len(line[i]) for line in body) for i in range(len(body[0]))]
    out = [indent + "  ".join(c.rjust(w) if i not in (2,) else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
           for line in body]
    warmup = rows[0]["warmup"]
    left = sum(r["sampled_left_out"] for r in rows)
    out.append(f"{indent}(each segment's first {warmup} step{'s' if warmup != 1 else ''} left out as warm-up"
               f"{f', and {left} sampled steps (layer hooks)' if left else ''}; s/step of the slowest rank and the "
               f"mean over ranks; s/epoch: s/step slowest × steps per epoch; the rest are means over ranks; "
               f"MB/step sent by the algorithm's formula{'; tokens/s: as the batches count them' if tokens else ''})")
    threads = [(r["segment"], r.get("ddptop_threads_s", 0.0)) for r in rows]
    if any(t > 0 for _, t in threads):  # beside the table, not a column: the screen's 160 columns hold no more
        out.append(f"{indent}(ddptop's other threads, CPU per step beside its `ddptop` time: "
                   + ", ".join(f"segment {s} +{_ms(t)}" for s, t in threads if t > 0) + ")")
    return out

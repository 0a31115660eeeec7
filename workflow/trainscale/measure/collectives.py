"""All-reduce microbenchmark, what it records: how fast the study's workers can sum a
gradient, by message size. The benchmark itself is trainscale.runners.collectives.

The figures (message size, time, algorithm and bus bandwidth) are nccl-tests' own, so the numbers
compare with nccl-tests output; docs/methods.md ("All-reduce benchmark") defines each.
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA_ID = "trainscale.collectives/1"
MIN_BYTES = 1024
DTYPE_BYTES = 4  # fp32, the dtype DDP reduces gradients in


def sizes(max_bytes: int, min_bytes: int = MIN_BYTES) -> list[int]:
    """Powers of 2 from `min_bytes` up to the first at or above `max_bytes`."""
    out = [min_bytes]
    while out[-1] < max_bytes:
        out.append(out[-1] * 2)
    return out


def planned_sizes(gradient: int | None, cap: int | None) -> tuple[list[int], bool]:
    """The message sizes to time, and whether `cap` cut them short of the largest gradient:
    up to the first power of 2 covering `gradient`, or only up to `cap` (the largest power of 2
    at or below it) when that comes first."""
    if cap is None or (gradient is not None and sizes(gradient)[-1] <= cap):
        return sizes(gradient), False
    below = [s for s in sizes(cap) if s <= cap] or [MIN_BYTES]
    return below, gradient is not None


def bus_factor(n: int) -> float:
    """Ring all-reduce traffic per rank in units of S: 2(n − 1)/n."""
    return 2 * (n - 1) / n


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), as metrics.percentile."""
    from trainscale.measure.metrics import percentile as pct

    return pct(values, q)


def summarise(size: int, seconds: list[float], n: int) -> dict:
    """One message size's row: the raw timings and the figures docs/methods.md defines."""
    p50, p95 = percentile(seconds, 50), percentile(seconds, 95)
    return {
        "bytes": size,
        "seconds": seconds,
        "p50_seconds": p50,
        "p95_seconds": p95,
        "algbw_bytes_per_second": size / p50,
        "busbw_bytes_per_second": size / p50 * bus_factor(n),
        "algbw_p95_bytes_per_second": size / p95,
        "busbw_p95_bytes_per_second": size / p95 * bus_factor(n),
    }


def read(path: str | Path) -> dict:
    """One benchmark file: its timings, or (status `failed`) why it has none; a clear error
    for anything that is neither."""
    rec = json.loads(Path(path).read_text())
    if rec.get("schema") != SCHEMA_ID:
        raise ValueError(f"{path}: not a {SCHEMA_ID} file")
    if rec.get("status", "ok") == "ok" and not rec.get("sizes"):
        raise ValueError(f"{path}: a {SCHEMA_ID} file without timings")
    return rec

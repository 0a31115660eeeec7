"""All-reduce microbenchmark, what it records: how fast the study's workers can sum a
gradient, by message size. The benchmark itself is trainscale.runners.collectives.

The `collectives` rule runs it once per (backend, workers, nodes) of the study: it starts
itself under torchrun (the same launch form as torch-ddp: srun across SLURM nodes) and rank 0
writes one JSON with every raw timing. The definitions are nccl-tests' own
(its doc/PERFORMANCE.md), so the numbers compare with nccl-tests output:

- message size S: bytes of the fp32 tensor every rank contributes and receives summed; the
  sizes are the powers of 2 from 1 KiB up to the first one at or above the largest gradient of
  the study's models (parameters × 4 bytes). `--max-bytes` (config `collectives.max_bytes`)
  cuts the series short at the largest power of 2 at or below it when that is smaller; the
  record then says `cut_short: true`, and the communication model reads bandwidths above it
  from the largest size measured.
- time t: for each repeat, a barrier starts every rank together, then the wall-clock seconds
  of one `all_reduce` (device synchronised) until the slowest rank returns (the max over ranks
  of each rank's time). `warmup` untimed repeats come first, then `iters` timed ones; t_p50 and
  t_p95 are percentiles over the timed repeats (linear interpolation).
- algorithm bandwidth: algbw = S / t in bytes/s (from t_p50; from t_p95 for the slow tail).
- bus bandwidth: busbw = algbw · 2(n − 1)/n for n ranks: what each rank's link carries per
  second in a ring all-reduce (each rank sends and receives 2(n − 1)/n · S bytes), so it is
  comparable across n and with the link's rated speed.
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
    """One message size's row: the raw timings and the figures defined in the docstring."""
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

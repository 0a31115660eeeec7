"""A run's per-step wall times, summarised for its record: percentiles, and batch means.

Every runner hands `Recorder.epoch` rank 0's step times (trainscale.measure.metrics); the record
keeps their median and 95th percentile for people, and their batch means for the analysis: the
mean of each of a few consecutive blocks of the epoch's steps. The blocks are what the cell's
confidence interval learns a run's own sampling error from (the within-run part of the model
in `trainscale.analysis.interval`): consecutive steps are correlated (a busy neighbour, the
allocator, the OS scheduler slow several in a row), so their spread says too little about the
error of their mean, while block means far enough apart are nearly independent (the method of
batch means; Schmeiser, "Batch size effects in the analysis of simulation output", Operations
Research 30, 1982, who finds 10 to 30 batches enough).

Blocks: BLOCKS per epoch, of consecutive steps, their lengths differing by at most one step
(the first `steps mod BLOCKS` one step longer), so every step is in exactly one block and the
block means weigh nearly alike; an epoch of fewer than BLOCKS steps gives one block per step
(the step times themselves): longer blocks would leave too few to estimate a variance from
(two steady epochs of 5 steps in blocks of 2 give 4 blocks, 3 degrees of freedom). With two
steady epochs the analysis pools 2 · BLOCKS = 16 blocks per run.
"""

from __future__ import annotations

#: Blocks an epoch's steps are cut into (fewer when it has fewer steps).
BLOCKS = 8


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def block_bounds(steps: int, blocks: int = BLOCKS) -> list[int]:
    """The first step of each block, and `steps` last: min(blocks, steps) blocks of
    consecutive steps whose lengths differ by at most one, the longer ones first."""
    k = min(blocks, steps)
    size, extra = divmod(steps, k) if k else (0, 0)
    bounds = [0]
    for i in range(k):
        bounds.append(bounds[-1] + size + (i < extra))
    return bounds


def batch_means(step_seconds: list[float], blocks: int = BLOCKS) -> list[float] | None:
    """The mean step seconds of each block of `block_bounds`; None without step times."""
    if not step_seconds:
        return None
    b = block_bounds(len(step_seconds), blocks)
    return [sum(step_seconds[i:j]) / (j - i) for i, j in zip(b, b[1:], strict=False)]

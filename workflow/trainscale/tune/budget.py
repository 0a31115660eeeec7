"""Round 1's cost, predicted in round 0 before any job: what tune.max_worker_hours is checked
against before the first run (docs/tune.md, "The method", 1).

No model here predicts a step's seconds before a run (the memory model predicts bytes), so
round 0's prediction is pilot-free and errs low: each run's set-up at SETUP_SECONDS, below
what tune runs measured, and each of its steps at its FLOPs (6 × the parameters × the samples
a step trains) over a rate no device of its kind reaches. A tune it lets start is checked
again before every later round on its measured seconds (`trainscale.tune.rule.over_budget`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainscale.data import imagesets
from trainscale.measure.flops import PEAKS
from trainscale.plan.preflight.memory_parts import param_count
from trainscale.plan.runspec import ConfigError, RunSpec

#: A tune run's set-up and teardown in wall_seconds (process start to record, less its
#: epochs): 84 PyTorch-family tune runs on the project's 2-core machine took 2.4 s (median;
#: 1.0 s the least), seed-small on digits; a GPU run's CUDA and NCCL start-up adds to it.
SETUP_SECONDS = 2.0
#: FLOP/s one CPU thread does not reach: above a core's fp32 peak (AVX-512, 2 FMA units × 16
#: lanes × 2 FLOPs × 3.5 GHz = 224 GFLOP/s).
CPU_THREAD_FLOPS = 250e9
#: FLOP/s no accelerator reaches: the highest dense peak of any device and precision in PEAKS.
DEVICE_FLOPS = max(v for _, row in PEAKS for v in row.values() if v)
#: Training FLOPs per parameter and sample (forward 2, backward 4): a dense layer's, less
#: than a convolution's (it reuses its weights); an untied embedding costs less than it
#: counts, which the rates' margin (several times any device's reach) covers.
FLOPS_PER_PARAM = 6


@dataclass(frozen=True)
class FirstRound:
    """Round 1 as round 0 predicts it: its runs and the worker-seconds they spend."""

    runs: int
    worker_seconds: float  # Σ world_size × wall_seconds, predicted (errs low)

    @property
    def worker_hours(self) -> float:
        return self.worker_seconds / 3600

    def words(self) -> str:
        """ "6 runs, 0.0034 worker-hours (…)"."""
        return (
            f"{self.runs} runs, {self.worker_hours:.2g} worker-hours (each run's set-up at "
            f"{SETUP_SECONDS:g} s, its steps at 6 × parameters FLOPs a sample at a rate no "
            "device of its kind reaches: an estimate that errs low)"
        )


def steps(spec: RunSpec) -> int:
    """A tune run's optimizer steps, at least: its epochs of `steps_per_epoch` steps, fewer
    where the data set's epoch is shorter (one an epoch where its size is not known here)."""
    try:
        samples = spec.samples or imagesets.spec_info(spec.to_dict()).train_samples
    except (ValueError, KeyError, OSError):
        samples = 0
    per_epoch = samples // spec.global_batch_size if samples else 1
    return spec.epochs * max(1, min(spec.steps_per_epoch or per_epoch, per_epoch))


def step_floor_seconds(spec: RunSpec) -> float:
    """A step's seconds, at least: its FLOPs over its ranks at a rate none of them reaches
    (0 where the model's parameters are not known without building it)."""
    try:
        params = param_count(spec)
    except (ValueError, KeyError, AttributeError, OSError):
        return 0.0
    samples = spec.global_batch_size * max(spec.seq_len or 1, 1)
    rate = DEVICE_FLOPS if spec.accelerator != "cpu" else CPU_THREAD_FLOPS * spec.threads_per_worker
    return FLOPS_PER_PARAM * params * samples / (spec.world_size * rate)


def run_seconds(spec: RunSpec) -> float:
    """A tune run's worker-seconds, predicted: world_size × (set-up + its steps)."""
    return spec.world_size * (SETUP_SECONDS + steps(spec) * step_floor_seconds(spec))


def first_round(specs: list[RunSpec]) -> FirstRound:
    """Round 1's prediction from the specs of its runs."""
    return FirstRound(len(specs), math.fsum(run_seconds(s) for s in specs))


def check(first: FirstRound, max_worker_hours: float | None) -> None:
    """ConfigError naming tune.max_worker_hours where round 1 alone would pass it."""
    if max_worker_hours is None or first.worker_hours <= max_worker_hours:
        return
    raise ConfigError(
        f"tune.max_worker_hours {max_worker_hours:g} cannot pay for round 1, predicted before "
        f"any job at {first.words()}. Raise tune.max_worker_hours above "
        f"{first.worker_hours:.2g}, or make round 1 cheaper: fewer cells (narrow matrix), "
        "fewer steps (tune.steps_per_epoch, tune.epochs)"
    )

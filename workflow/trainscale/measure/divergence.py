"""Whether a run's training loss stayed sound, and the `diverged` record of one that did not.

A run that stopped learning must never be ranked: its throughput is of steps that trained
nothing. Every runner hands its loop's per-step training losses (the mean over ranks, or what
its framework logs) to a `LossWatch` once per epoch, at the epoch's end, where the loop
synchronises anyway: the losses stay on the device while the epoch runs, so the check adds no
device wait per step, and every rank reaches the same verdict from the same (all-reduced)
numbers, so every rank stops after the same epoch and none waits in a collective for one that
stopped.

A step's loss is unsound when it is not finite (nan, inf), or when it is more than
`EXPLODED` times the run's first loss (at least 1): Adam with a learning rate of 1e6 keeps the
cross-entropy finite, near 1e21 (measured on seed-small), yet it has plainly diverged, and no
run that learns moves its loss ten thousand times above where it started. A step that fp16's
loss scaling skipped (GradScaler, DeepSpeed) is not divergence: its loss is sound; such steps
are counted apart (`precision.skipped_steps`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: a loss this many times the run's first one (or 1, if larger) counts as diverged
EXPLODED = 1e4


@dataclass(frozen=True)
class Divergence:
    """Where the loss first went unsound: `step` counts from 1 within epoch `epoch`."""

    epoch: int
    step: int
    loss: float
    last_sound: float | None  # the step before's loss; None when the first step was unsound

    def message(self) -> str:
        """The record's `error`: what was seen, where, and the last sound loss."""
        seen = f"{self.loss:g}" if not math.isfinite(self.loss) else f"{self.loss:.3g}"
        last = "none" if self.last_sound is None else f"{self.last_sound:.3g}"
        why = "" if not math.isfinite(self.loss) else f" (over {EXPLODED:g} times its first)"
        return (
            f"loss became {seen}{why} at epoch {self.epoch} step {self.step}; last finite "
            f"{last}. The run stopped after that epoch and is never ranked; a lower "
            "optimizer.lr (or lr_scaling) usually cures it"
        )


class LossWatch:
    """The run's losses, epoch by epoch, until the first unsound one."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.diverged: Divergence | None = None

    def first_unsound(self, losses: Sequence[float]) -> int | None:
        """The index of the first unsound loss among `losses`, or None; changes nothing."""
        first = self.first
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                return i
            first = loss if first is None else first
            if abs(loss) > EXPLODED * max(abs(first), 1.0):
                return i
        return None

    def epoch(
        self, epoch: int, losses: Sequence[float], elsewhere: bool = False
    ) -> Divergence | None:
        """Check epoch `epoch`'s per-step `losses`; the Divergence at the first unsound one, or
        None. `elsewhere`: another worker saw an unsound loss where these are sound (Horovod's
        Keras workers log their own losses): the divergence is then put at the epoch's last
        step, where this worker learned of it."""
        bad = self.first_unsound(losses)
        for loss in losses[:bad]:
            self.first = loss if self.first is None else self.first
            self.last = loss
        if bad is not None:
            self.diverged = Divergence(epoch, bad + 1, losses[bad], self.last)
        elif elsewhere:
            self.diverged = Divergence(epoch, max(len(losses), 1), math.nan, self.last)
        return self.diverged


def step_losses(running_means: Sequence[float]) -> list[float]:
    """Each step's loss from the running means a Keras epoch logs after every step (step k's
    loss = k·mean_k − (k−1)·mean_(k−1)); an unsound mean stays unsound."""
    out, before = [], 0.0
    for k, mean in enumerate(running_means, 1):
        out.append(k * mean - (k - 1) * before if math.isfinite(mean) else mean)
        before = mean
    return out


def mark(record: dict, diverged: Divergence) -> dict:
    """`record` as a diverged run's: status, error, where, and the last sound loss. Its
    epochs are the ones completed before the divergence."""
    record["status"] = "diverged"
    record["error"] = diverged.message()
    record["diverged_at"] = {"epoch": diverged.epoch, "step": diverged.step}
    record["last_finite_loss"] = diverged.last_sound
    return record

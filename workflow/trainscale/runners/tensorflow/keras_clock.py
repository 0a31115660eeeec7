"""The Keras loop's epoch clock (keras_loop.py): wall-clock seconds of each epoch's training
steps, the fault hook in its middle step and the losses Keras logged, handed to the loop after
the clock stops. `EpochClock` times steps that run in this process; `ScheduledEpochClock` times
steps a `ClusterCoordinator` schedules on remote workers (tf-ps).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale.measure import divergence  # noqa: E402


class EpochClock(keras.callbacks.Callback):
    """Wall-clock (`time.perf_counter`) seconds of each epoch's training steps and of each step.

    Keras converts a step's logs to numpy before `on_train_batch_end` for a callback like this
    one (no `_supports_tf_logs`), which waits for the step to finish; under the strategies every
    step ends in an all-reduce, so the epoch's end is synchronised across replicas and workers.
    `mid_epoch(epoch)` runs before the middle step (the fault hook); `after_epoch(epoch,
    seconds, step_seconds, logs, losses)` runs after the clock stops, `losses` each step's loss
    (from the running mean Keras logged after each step, divergence.step_losses).
    """

    #: False where only the epoch's mean loss is known: a divergence is put at its last step
    per_step_losses = True

    def __init__(self, after_epoch, mid_epoch=None, steps: int = 0) -> None:
        super().__init__()
        self.after_epoch = after_epoch
        self.mid_epoch, self.half = mid_epoch, steps // 2
        self._epoch = 0
        self._t_epoch = self._t_step = 0.0
        self._steps: list[float] = []
        self._losses: list[float] = []

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = epoch + 1
        self._steps, self._losses = [], []
        self._t_epoch = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        if self.mid_epoch and batch == self.half:
            self.mid_epoch(self._epoch)
        self._t_step = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self._steps.append(time.perf_counter() - self._t_step)
        self._losses.append(float((logs or {}).get("loss", np.nan)))

    def on_epoch_end(self, epoch, logs=None) -> None:
        seconds = time.perf_counter() - self._t_epoch
        losses = divergence.step_losses(self._losses)
        self.after_epoch(epoch + 1, seconds, self._steps, dict(logs or {}), losses)


class ScheduledEpochClock(EpochClock):
    """The clock of steps a `ClusterCoordinator` schedules on remote workers: each epoch from
    its first scheduled step to the moment every scheduled step has finished
    (`coordinator.join`). Logs stay remote values (`_supports_tf_logs`): turning a step's logs
    into numbers waits for that step, which would make the coordinator run one step at a time.
    So no step is timed (`step_seconds` is empty) and only the epoch's mean loss is known."""

    per_step_losses = False

    def __init__(self, coordinator, after_epoch, mid_epoch=None, steps: int = 0) -> None:
        super().__init__(after_epoch, mid_epoch, steps)
        self._supports_tf_logs = True
        self.coordinator = coordinator

    def on_train_batch_end(self, batch, logs=None) -> None:
        """Nothing: the step may still run on its worker."""

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.coordinator.join()
        seconds = time.perf_counter() - self._t_epoch
        loss = float(logs["loss"])
        self.after_epoch(epoch + 1, seconds, [], {"loss": loss}, [loss])

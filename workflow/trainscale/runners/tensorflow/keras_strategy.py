"""The plug-in interface of the Keras loop (keras_loop.py): `Placement`, where a process sits,
and `KerasStrategy`, whose hooks say what a strategy does differently from one process training
on what it sees. Each hook's default is that one process's behaviour.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.data import imagesets  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402
from trainscale.runners.tensorflow import keras_record, keras_tokens  # noqa: E402
from trainscale.runners.tensorflow.keras_clock import EpochClock  # noqa: E402
from trainscale.runners.tensorflow.keras_data import eval_dataset, train_dataset  # noqa: E402
from trainscale.runners.tensorflow.keras_eval import (  # noqa: E402
    scorer,
    scores_of,
    token_scores_of,
)
from trainscale.runners.tensorflow.keras_input import (  # noqa: E402
    TimedTrainFunction,
    image_test,
    image_train,
)


@dataclass(frozen=True)
class Placement:
    """Where this process sits and what it trains on, as its plug-in's `configure` set it up."""

    rank: int  # this process's worker index (task id, Horovod rank); 0 writes the metrics
    gpu: bool  # trains on GPUs (else on CPU)
    replicas: int = 1  # workers (model replicas) in this process: >1 for tf-mirrored only
    logical: bool = False  # the replicas are logical devices carved out of one CPU
    trains: bool = True  # False: it only serves (a tf-ps server or worker), no loop


class KerasStrategy:
    """A strategy on the Keras loop. The defaults are one process training on what it sees."""

    #: frameworks besides TensorFlow and tf-keras whose versions go into `env.frameworks`
    frameworks: dict[str, str] = {}
    #: whether the run measures a `framework` part after training (runners.guarded), the
    #: part plan/faults.py lets a fault be planted in
    framework_part = True

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        #: the tf.distribute strategy `configure` made, if any (not before: making one starts
        #: TensorFlow's runtime, after which threads and devices can no longer be set)
        self.strategy: tf.distribute.Strategy | None = None
        self._test_data: tf.data.Dataset | None = None
        self._scorer: keras.Model | None = None

    def configure(self) -> Placement:
        """Threads, visible devices and the tf.distribute strategy; runs before TensorFlow
        starts its runtime."""
        raise NotImplementedError

    def scope(self) -> contextlib.AbstractContextManager:
        """Where the model and optimizer are built (their variables placed)."""
        return self.strategy.scope() if self.strategy else contextlib.nullcontext()

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        """The optimizer as the strategy wraps it (Horovod's averages the gradients)."""
        return optimizer

    def train_dataset(self, arrays: data.Arrays, x: np.ndarray, steps: int, p: Placement):
        """What `model.fit` reads: global batches, which the strategy splits over replicas."""
        return train_dataset(self.spec, arrays, x, steps, p.replicas)

    def token_train(self, p: Placement) -> keras_tokens.TokenTrain:
        """The token windows `model.fit` reads: every rank's batch of each step, stacked in
        rank order into the global batch, which the strategy splits (keras_tokens.py)."""
        b = self.spec.per_worker_batch_size
        return keras_tokens.TokenTrain(
            self.spec, range(self.spec.world_size), self.spec.world_size, b
        )

    def fit_steps(self, steps: int) -> int:
        """`model.fit`'s steps in an epoch of `steps` global batches, which its record counts."""
        return steps

    def epoch_clock(self, after_epoch, mid_epoch, steps: int) -> EpochClock:
        """The loop's clock of `steps` steps an epoch (keras_clock.py)."""
        return EpochClock(after_epoch, mid_epoch, steps)

    def input_clock(self, model) -> TimedTrainFunction | None:
        """What times the epoch's data wait in `model`'s train function (None: not measured)."""
        return TimedTrainFunction.install(model)

    def callbacks(self) -> list[keras.callbacks.Callback]:
        """Callbacks that run before the loop's clock in every step (Horovod's broadcast)."""
        return []

    def mean_over_workers(self, value: float) -> float:
        """A per-worker figure averaged over workers (Keras' logs already are, under a
        tf.distribute strategy)."""
        return value

    def image_train(self, p: Placement) -> tuple[tf.data.Dataset, int]:
        """What `model.fit` reads from the user's images, and the steps of an epoch: global
        batches, read whole by this process (keras_input.image_train)."""
        return image_train(self.spec, self.spec.global_batch_size)

    def evaluate(self, model, arrays: data.Arrays | None, x: np.ndarray | None, p: Placement):
        """The `test` block's accuracy, mean loss and confusion over the whole test set
        (keras_eval.py); collective under a strategy, each replica scoring its share of
        batches of the global batch. On the user's images (`arrays` None) each process reads
        the whole test split (keras_input.image_test). On token data (`seq_len`) next-token
        accuracy, loss and perplexity over the test windows in global batches."""
        if self.spec.seq_len:
            if self._test_data is None:
                self._test_data = keras_tokens.eval_dataset(
                    self.spec, self.spec.global_batch_size, p.replicas
                )
            return token_scores_of(self.scorer(model, 0, tokens=True), self._test_data)
        if self._test_data is None and arrays is None:
            self._test_data = image_test(self.spec, self.spec.per_worker_batch_size * p.replicas)
        if self._test_data is None:  # built once, at the first evaluation
            self._test_data = eval_dataset(
                self.spec, arrays, x, arrays.test_y, self.spec.global_batch_size, p.replicas
            )
        classes = imagesets.spec_info(self.spec.to_dict()).num_classes
        return scores_of(self.scorer(model, classes), self._test_data, classes)

    def scorer(self, model, classes: int, tokens: bool = False) -> keras.Model:
        """`model`'s scoring model (keras_eval.scorer), built once, in the plug-in's scope."""
        if self._scorer is None:
            with self.scope():
                self._scorer = scorer(model, classes, tokens)
        return self._scorer

    def gather(self, row: list[float | None], host: str) -> list[tuple[list[float | None], str]]:
        """Every worker process's `row` and host name, in rank order (all of them on rank 0)."""
        return [(row, host)]

    def fit(self, model, dataset, steps: int, callbacks: list, rec, test: dict) -> None:
        """All epochs. `rec` (the metrics.Recorder holding the epochs so far) and `test` (the
        latest test scores) are the loop's record of training, which Horovod elastic commits
        and restores with the model (it runs this inside `hvd.elastic.run`)."""
        model.fit(
            dataset,
            epochs=self.spec.epochs,
            steps_per_epoch=steps,
            callbacks=callbacks,
            verbose=0,
        )

    def final_rank(self, p: Placement) -> int:
        """This process's rank after training (rank 0 writes the record): the placement's,
        unless the world re-formed on the way (Horovod elastic renumbers the workers)."""
        return p.rank

    def measured(self, p: Placement, gathered: list | None) -> keras_record.Measured:
        """The record's device, memory and oversubscription from every worker's `gathered`
        figures (None where the gather failed), combined as keras_record.measured does."""
        return keras_record.measured(self.spec, p, gathered)

    def extra_metrics(self) -> dict:
        """Record blocks only this strategy writes (e.g. `horovod`)."""
        return {}

    def teardown(self) -> None:
        """After the record is written (or on a worker that writes none)."""

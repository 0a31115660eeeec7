"""Horovod with Keras (`horovod-keras`, `horovod-keras-elastic`), plug-ins on the Keras loop
(keras_loop.py): tf-keras `model.fit`, one process per worker, started by `horovodrun`;
gradients averaged by `hvd.DistributedOptimizer` (ring all-reduce over gloo on CPU, NCCL on
GPU), initial variables broadcast from rank 0 by Horovod's callback (elastic: by the state's
sync at every start).

Keras 2 only (tf-keras, `TF_USE_LEGACY_KERAS=1`, set by the launcher): with Keras 3,
Horovod's `BroadcastGlobalVariablesCallback` raises, and without it the gradients are silently
*not* averaged (the ranks diverge) -- horovod/horovod#4290.

Every worker reads the same shuffled order of global batches and trains on its share of each
(as MultiWorkerMirroredStrategy does); test scores are summed over the workers' strides of the
test set with `hvd.allreduce`.

Elastic (`horovod-keras-elastic`, as `horovod-torch-elastic`): model.fit runs inside
`hvd.elastic.run` on a `KerasState` (model and optimizer variables, epochs done, the loop's
epoch records and test scores, the membership log), committed after every epoch. When the
host discovery script reports fewer or more slots, the workers stop at the next commit,
Horovod re-forms the ring and fit goes on from the committed epoch with the new world size:
the *global* batch stays the spec's (each worker takes global / size of it), so the
optimisation is unchanged. A worker that dies mid-epoch costs that epoch (the state rolls back
to the last commit). Each change lands in the metrics' `horovod.membership`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import horovod  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.measure import metrics  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402
from trainscale.runners.device_check import require_nccl  # noqa: E402
from trainscale.runners.tensorflow import keras_loop as loop  # noqa: E402
from trainscale.runners.tensorflow import keras_tokens  # noqa: E402
from trainscale.runners.tensorflow.keras_data import eval_dataset, train_dataset  # noqa: E402
from trainscale.runners.tensorflow.keras_eval import scores_of, token_scores_of  # noqa: E402
from trainscale.runners.tensorflow.keras_input import image_train  # noqa: E402


class HorovodKeras(loop.KerasStrategy):
    """`horovod-keras`: each process feeds its own model its share of every global batch;
    Horovod's optimizer averages the gradients."""

    frameworks = {"horovod": horovod.__version__}
    #: horovodrun starts exactly the spec's workers (elastic: as many as the hosts offer)
    fixed_world = True

    def configure(self) -> loop.Placement:
        loop.set_threads(self.spec, 1)  # before hvd.init, which starts TensorFlow's runtime
        hvd.init()
        require_nccl(self.spec.accelerator, bool(hvd_tf.nccl_built()), hvd.rank())
        gpus = loop.physical_gpus(self.spec)
        if gpus:
            loop.visible_gpus(gpus, hvd.local_rank(), 1, self.spec.strategy)
        if self.fixed_world and hvd.size() != self.spec.world_size:
            raise RuntimeError(
                f"horovodrun started {hvd.size()} workers, the run needs {self.spec.world_size}"
            )
        return loop.Placement(rank=hvd.rank(), gpu=bool(gpus))

    def wrap_optimizer(self, optimizer):
        return hvd.DistributedOptimizer(optimizer)

    def train_dataset(self, arrays: data.Arrays, x: np.ndarray, steps: int, p: loop.Placement):
        return train_dataset(self.spec, arrays, x, steps, 1, rank=p.rank)

    def token_train(self, p: loop.Placement) -> keras_tokens.TokenTrain:
        """Each worker reads its own rank's token windows (those torch's rank reads)."""
        return keras_tokens.TokenTrain(
            self.spec, [p.rank], hvd.size(), self.spec.global_batch_size // hvd.size()
        )

    def image_train(self, p: loop.Placement):
        """Each worker reads its own share of the user's images, in its per-worker batch."""
        return image_train(self.spec, self.spec.per_worker_batch_size, p.rank, hvd.size())

    def callbacks(self) -> list:
        return [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]

    def mean_over_workers(self, value: float) -> float:
        # (Horovod's MetricAverageCallback would do it, but in 0.28.1 it calls Keras 3's
        # backend, which has no `constant`, even when tf-keras trains)
        return float(hvd_tf.allreduce(tf.constant(value, tf.float64), op=hvd_tf.Average).numpy())

    def evaluate(self, model, arrays: data.Arrays, x: np.ndarray, p: loop.Placement) -> dict:
        """Accuracy, mean loss and confusion over the whole test set: each worker scores its
        stride in batches of its training batch, the sums are added with hvd.allreduce.
        On the user's images every worker scores the whole test split (the same weights).
        On token data each scores its stride of the test windows (as torch's ranks do)."""
        rank, size = hvd.rank(), hvd.size()

        def all_sum(v: np.ndarray) -> np.ndarray:
            return hvd_tf.allreduce(tf.constant(v, tf.float64), op=hvd_tf.Sum).numpy()

        if self.spec.seq_len:
            if self._test_data is None:
                self._test_data = keras_tokens.eval_dataset(
                    self.spec, self.spec.global_batch_size // size, 1, rank, size
                )
            return token_scores_of(self.scorer(model, 0, tokens=True), self._test_data, all_sum)
        if arrays is None:
            return super().evaluate(model, arrays, x, p)
        n = len(arrays.test_y)
        if self._test_data is None:
            self._test_data = eval_dataset(
                self.spec, arrays, x[rank::size], arrays.test_y[rank::size],
                self.spec.per_worker_batch_size, 1,
            )  # fmt: skip
        mine = self._test_data if len(range(rank, n, size)) else None
        classes = arrays.info.num_classes
        return scores_of(self.scorer(model, classes), mine, classes, all_sum)

    def gather(self, row: list[float | None], host: str) -> list[tuple[list[float | None], str]]:
        table = hvd_tf.allgather(tf.constant([loop.nan_for_none(row)], tf.float64)).numpy()
        hosts = hvd_tf.allgather_object(host)
        return [(loop.none_for_nan(r), h) for r, h in zip(table, hosts, strict=True)]

    def extra_metrics(self) -> dict:
        return {
            "horovod": {
                "timeline": os.environ.get("HOROVOD_TIMELINE"),
                "final_world_size": hvd.size(),
            }
        }


class CommitEachEpoch(keras.callbacks.Callback):
    """After the loop's clock recorded an epoch: the epochs done, the records and test scores
    into the state, then Horovod's commit (a save point, and where a change of hosts stops the
    workers).

    In place of Horovod's UpdateEpochStateCallback and CommitStateCallback: the first counts
    epochs from fit's start (fit would have to run `epochs - state.epoch` epochs numbered from
    0 again, which the loop's clock and evaluation schedule read), the second commits after
    every batch, before the epoch is recorded, unless told a number of batches per commit.
    """

    def __init__(self, state, rec: metrics.Recorder, test: dict) -> None:
        super().__init__()
        self.state, self.rec, self.test = state, rec, test

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.state.epoch = epoch + 1  # Keras numbers epochs from fit's initial_epoch
        self.state.history = [dict(e) for e in self.rec.epochs]
        self.state.test = dict(self.test)
        self.state.commit()


class HorovodKerasElastic(HorovodKeras):
    """`horovod-keras-elastic`: horovod-keras under `hvd.elastic.run`; workers may leave or join
    between epochs."""

    fixed_world = False

    def __init__(self, spec: RunSpec) -> None:
        super().__init__(spec)
        self.membership: list[dict] = []
        #: (rank, size, epochs done) -> this worker's share at that size, from that epoch on
        self._refeed: Callable[[int, int, int], tf.data.Dataset] | None = None

    def train_dataset(self, arrays: data.Arrays, x: np.ndarray, steps: int, p: loop.Placement):
        def refeed(rank: int, size: int, done: int) -> tf.data.Dataset:
            return train_dataset(
                self.spec, arrays, x, steps, 1, rank=rank, size=size, epochs_done=done
            )

        self._refeed = refeed  # fit builds each (re)start's share with it
        return super().train_dataset(arrays, x, steps, p)

    def token_train(self, p: loop.Placement) -> keras_tokens.TokenTrain:
        feed = super().token_train(p)
        spec = self.spec

        def refeed(rank: int, size: int, done: int) -> tf.data.Dataset:
            # the windows of rank `rank` of `size`, cut to the start's steps per epoch (the
            # global batch is the spec's, so a smaller world has as many steps or more)
            again = keras_tokens.TokenTrain(spec, [rank], size, spec.global_batch_size // size)
            again.steps = feed.steps
            return again.dataset(spec, 1, done)

        self._refeed = refeed
        return feed

    def callbacks(self) -> list:
        return []  # the state's sync broadcasts rank 0's variables at every (re)start

    def fit(self, model, dataset, steps: int, callbacks: list, rec, test: dict) -> None:
        spec = self.spec
        # the optimizer's slots exist before the state copies them: a joining worker's sync
        # then broadcasts the same variables as the survivors'
        model.optimizer.build(model.trainable_variables)
        state = hvd.elastic.KerasState(model, epoch=0, history=[], test=dict(test), membership=[])

        @hvd.elastic.run
        def train(state) -> None:
            # state was just synced from rank 0: every worker holds the same records
            rec.epochs[:] = [dict(e) for e in state.history]
            test.clear()
            test.update(state.test)
            self._test_data = None  # each worker's test stride follows its rank and the size
            rank, size = hvd.rank(), hvd.size()
            first = not state.membership
            if first or state.membership[-1]["world_size"] != size:
                state.membership.append(
                    {"after_epoch": state.epoch, "world_size": size, "utc": metrics.utc_now()}
                )
                if rank == 0:
                    print(
                        f"horovod elastic: {size} workers from epoch {state.epoch + 1}", flush=True
                    )
            feed = dataset  # the start's; after a change, this worker's share at this size
            if not (first and size == spec.world_size):
                feed = self._refeed(rank, size, state.epoch)
            model.fit(
                feed,
                initial_epoch=state.epoch,
                epochs=spec.epochs,
                steps_per_epoch=steps,
                callbacks=[*callbacks, CommitEachEpoch(state, rec, test)],
                verbose=0,
            )

        train(state)
        self.membership = state.membership

    def final_rank(self, p: loop.Placement) -> int:
        return hvd.rank()

    def extra_metrics(self) -> dict:
        blocks = super().extra_metrics()
        blocks["horovod"]["membership"] = self.membership
        return blocks


PLUGINS: dict[str, type[HorovodKeras]] = {
    "horovod-keras": HorovodKeras,
    "horovod-keras-elastic": HorovodKerasElastic,
}


def main(spec: RunSpec, out: str) -> None:
    loop.run(PLUGINS[spec.strategy](spec), out)

"""Horovod with Keras (`horovod-keras`), a plug-in on the Keras loop (runners/keras_loop.py):
tf-keras `model.fit`, one process per worker, started by `horovodrun`; gradients averaged by
`hvd.DistributedOptimizer` (ring all-reduce over gloo on CPU, NCCL on GPU), initial variables
broadcast from rank 0 by Horovod's callback.

Keras 2 only (tf-keras, `TF_USE_LEGACY_KERAS=1`, set by the launcher): with Keras 3,
Horovod's `BroadcastGlobalVariablesCallback` raises, and without it the gradients are silently
*not* averaged (the ranks diverge) -- horovod/horovod#4290.

Every worker reads the same shuffled order of global batches and trains on its share of each
(as MultiWorkerMirroredStrategy does); test scores are summed over the workers' strides of the
test set with `hvd.allreduce`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import horovod  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.matrix import RunSpec  # noqa: E402
from trainscale.runners.keras_data import eval_dataset, train_dataset  # noqa: E402
from trainscale.runners.keras_input import image_train  # noqa: E402
from trainscale.runners.keras_loop import (  # noqa: E402
    KerasStrategy,
    Placement,
    nan_for_none,
    none_for_nan,
    run,
    set_threads,
    visible_gpus,
)


class HorovodKeras(KerasStrategy):
    """`horovod-keras`: each process feeds its own model its share of every global batch;
    Horovod's optimizer averages the gradients."""

    frameworks = {"horovod": horovod.__version__}

    def configure(self) -> Placement:
        set_threads(self.spec, 1)  # before hvd.init, which starts TensorFlow's runtime
        hvd.init()
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            visible_gpus(gpus, hvd.local_rank(), 1, self.spec.strategy)
        if hvd.size() != self.spec.world_size:
            raise RuntimeError(
                f"horovodrun started {hvd.size()} workers, the run needs {self.spec.world_size}"
            )
        return Placement(rank=hvd.rank(), gpu=bool(gpus))

    def wrap_optimizer(self, optimizer):
        return hvd.DistributedOptimizer(optimizer)

    def train_dataset(self, arrays: data.Arrays, x: np.ndarray, steps: int, p: Placement):
        return train_dataset(self.spec, arrays, x, steps, 1, rank=p.rank)

    def image_train(self, p: Placement):
        """Each worker reads its own share of the user's images, in its per-worker batch."""
        return image_train(self.spec, self.spec.per_worker_batch_size, p.rank, hvd.size())

    def callbacks(self) -> list:
        return [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]

    def mean_over_workers(self, value: float) -> float:
        # (Horovod's MetricAverageCallback would do it, but in 0.28.1 it calls Keras 3's
        # backend, which has no `constant`, even when tf-keras trains)
        return float(hvd_tf.allreduce(tf.constant(value, tf.float64), op=hvd_tf.Average).numpy())

    def evaluate(self, model, arrays: data.Arrays, x: np.ndarray, p: Placement):
        """Accuracy and mean loss over the whole test set: each worker scores its stride in
        batches of its training batch, the sums are added over workers with hvd.allreduce.
        On the user's images every worker scores the whole test split (the same weights)."""
        if arrays is None:
            return super().evaluate(model, arrays, x, p)
        rank, size, n = hvd.rank(), hvd.size(), len(arrays.test_y)
        count = len(range(rank, n, size))
        if self._test_data is None:
            self._test_data = eval_dataset(
                self.spec, arrays, x[rank::size], arrays.test_y[rank::size],
                self.spec.per_worker_batch_size, 1,
            )  # fmt: skip
        if count:
            res = model.evaluate(self._test_data, verbose=0, return_dict=True)
        else:
            res = {"accuracy": 0.0, "loss": 0.0}
        sums = tf.constant([res["accuracy"] * count, res["loss"] * count], tf.float64)
        total = hvd_tf.allreduce(sums, op=hvd_tf.Sum).numpy()
        return float(total[0] / n), float(total[1] / n)

    def gather(self, row: list[float | None], host: str) -> list[tuple[list[float | None], str]]:
        table = hvd_tf.allgather(tf.constant([nan_for_none(row)], tf.float64)).numpy()
        hosts = hvd_tf.allgather_object(host)
        return [(none_for_nan(r), h) for r, h in zip(table, hosts, strict=True)]

    def extra_metrics(self) -> dict:
        return {
            "horovod": {
                "timeline": os.environ.get("HOROVOD_TIMELINE"),
                "final_world_size": hvd.size(),
            }
        }


def main(spec: RunSpec, out: str) -> None:
    run(HorovodKeras(spec), out)

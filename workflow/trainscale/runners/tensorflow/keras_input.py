"""What the Keras loop feeds and how long it waits for it: the user's images through tf.data
(trainscale.data.imagedata_tf), a built-in's batches resized to `image_size`, and the per-epoch
data wait (trainscale.measure.datawait's definition) measured inside `model.fit`.

Keras' own train function takes its batch with `next(iterator)` inside the compiled step,
where no Python clock can see how long the step waited for it. `TimedTrainFunction` is the
same function (tf_keras' `make_train_function` with one step per execution) with that one
`next()` taken in Python, between two clock reads, and the compiled step run on what it
returned. Nothing else in the step changes.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import time  # noqa: E402

import tensorflow as tf  # noqa: E402
from tf_keras.src.engine.training import _minimum_control_deps, reduce_per_replica  # noqa: E402

from trainscale.data import imagedata_tf  # noqa: E402
from trainscale.data.imagesets import RankRead  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402


class TimedTrainFunction:
    """`model.train_function` with the batch fetched in Python: `seconds` is the time spent
    waiting in `next(iterator)` since the last `take()` (one epoch's data wait)."""

    def __init__(self, model) -> None:
        self.seconds = 0.0

        def run_step(data):
            outputs = model.train_step(data)
            with tf.control_dependencies(_minimum_control_deps(outputs)):
                model._train_counter.assign_add(1)
            return outputs

        def step(data):
            outputs = model.distribute_strategy.run(run_step, args=(data,))
            return reduce_per_replica(
                outputs, model.distribute_strategy, reduction=model.distribute_reduction_method
            )

        self._step = tf.function(step, reduce_retracing=True)

    def __call__(self, iterator):
        start = time.perf_counter()
        data = next(iterator)
        self.seconds += time.perf_counter() - start
        return self._step(data)

    def take(self) -> float:
        """The wait summed since the last call, and start a new sum."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    @classmethod
    def install(cls, model) -> TimedTrainFunction:
        """Put it in place of the compiled model's train function (`fit` keeps a set one;
        `compile` would drop it, so install after compiling)."""
        timed = cls(model)
        model.train_function = timed
        return timed


def image_train(spec: RunSpec, batch: int, rank: int = 0, world: int = 1):
    """(dataset repeating epochs of `steps` batches, steps) of the user's images: `batch`
    images per element for this `rank` of `world` readers (a tf.distribute strategy in one
    process reads all, rank 0 of 1, and splits each global batch; Horovod's workers each read
    their own share). Every epoch is a fresh shuffle (tf.data reshuffles each pass)."""
    read = RankRead(
        spec.image_source, tuple(spec.image_size), batch, rank, world, spec.loader_workers
    )
    ds, steps = imagedata_tf.train_dataset(read, spec.seed)
    if spec.steps_per_epoch is not None:
        steps = min(steps, spec.steps_per_epoch)
    return ds.take(steps).repeat(), steps


def image_test(spec: RunSpec, batch: int):
    """The whole test split of the user's images, in order, in batches of `batch`."""
    read = RankRead(spec.image_source, tuple(spec.image_size), batch, 0, 1, spec.loader_workers)
    return imagedata_tf.eval_dataset(read)


def resize(x: tf.Tensor, size: tuple[int, int] | None) -> tf.Tensor:
    """A built-in's NHWC batch at `image_size`: bilinear, antialiased, resized to cover it and
    centre-cropped (as trainscale.data.imagedata.resize_batch does for PyTorch)."""
    if size is None or tuple(x.shape[1:3]) == tuple(size):
        return x
    h, w = int(x.shape[1]), int(x.shape[2])
    scale = max(size[0] / h, size[1] / w)
    cover = (max(size[0], round(h * scale)), max(size[1], round(w * scale)))
    out = tf.image.resize(x, cover, method="bilinear", antialias=True)
    top, left = (cover[0] - size[0]) // 2, (cover[1] - size[1]) // 2
    return out[:, top : top + size[0], left : left + size[1], :]

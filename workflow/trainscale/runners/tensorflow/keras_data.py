"""The Keras loop's input: the arrays the PyTorch runners use, normalised the same way, as
`tf.data` pipelines of global batches (or one worker's share of each, for Horovod).

What makes the comparison with PyTorch fair: the same arrays and normalisation
(`trainscale.data`, x / x_max, then per-channel mean/std, resized to `image_size` where set),
the same global batch, the same
steps per epoch (remainder dropped) and the same thread budget per worker.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402
from trainscale.runners.tensorflow.keras_input import resize  # noqa: E402


def nhwc(x: np.ndarray) -> np.ndarray:
    """NCHW (trainscale.data's layout, PyTorch's) -> NHWC (Keras')."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def normaliser(arrays: data.Arrays):
    """uint8 NHWC batch -> float32, exactly as the PyTorch runners: x / x_max, - mean, / std."""
    mean = tf.constant(np.asarray(arrays.mean, dtype=np.float32))
    std = tf.constant(np.asarray(arrays.std, dtype=np.float32))

    def f(x):
        return (tf.cast(x, tf.float32) / arrays.x_max - mean) / std

    return f


def pipeline_options(spec: RunSpec, replicas: int) -> tf.data.Options:
    """Auto-shard by data (every worker reads the same shuffled order and keeps its share of each
    global batch), and the input pipeline held to the thread budget of this process' workers
    (`replicas` of them: more than one only where one process runs several, as tf-mirrored)."""
    o = tf.data.Options()
    o.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    o.threading.private_threadpool_size = replicas * spec.threads_per_worker
    o.threading.max_intra_op_parallelism = 1
    return o


def train_dataset(
    spec: RunSpec,
    arrays: data.Arrays,
    x: np.ndarray,
    steps: int,
    replicas: int,
    rank: int | None = None,
    size: int | None = None,
    epochs_done: int = 0,
) -> tf.data.Dataset:
    """Epochs of `steps` global batches: the training set replicated `scale` times, reshuffled
    every epoch with the run's seed (the same order on every worker), remainder dropped; an
    epoch cut by `steps_per_epoch` takes the first `steps` batches of its order, as the PyTorch
    runners do, and the next epoch starts a new order.

    With `rank` (a worker that feeds its own model, as under Horovod) each element is that
    worker's share of the global batch, rows [rank × b, (rank + 1) × b) for the per-worker
    batch b (global / `size` where the world is not the spec's: Horovod elastic after a worker
    left); without it the whole global batch, which a tf.distribute strategy splits.
    `epochs_done` epochs of the order are skipped (a restarted elastic fit goes on where the
    last committed epoch ended, not from the first epoch's order again).
    """
    n = len(arrays.train_y)
    total = n * spec.scale
    images, labels, norm = tf.constant(x), tf.constant(arrays.train_y), normaliser(arrays)
    b = spec.global_batch_size // size if size else spec.per_worker_batch_size

    def batch(idx):
        if rank is not None:  # (decided when the map is traced: no op for the whole batch)
            idx = idx[rank * b : (rank + 1) * b]
        idx = idx % n
        return resize(norm(tf.gather(images, idx)), spec.image_size), tf.gather(labels, idx)

    return (
        tf.data.Dataset.range(total)
        .shuffle(total, seed=spec.seed, reshuffle_each_iteration=True)
        .batch(spec.global_batch_size, drop_remainder=True)
        .take(steps)
        .repeat()
        .skip(epochs_done * steps)
        .map(batch)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(pipeline_options(spec, replicas))
    )


def eval_dataset(
    spec: RunSpec, arrays: data.Arrays, x: np.ndarray, y: np.ndarray, batch: int, replicas: int
) -> tf.data.Dataset:
    """Test images `x` (NHWC) and labels `y` in batches of `batch`, normalised as in training."""
    norm = normaliser(arrays)
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(batch)
        .map(lambda a, b: (resize(norm(a), spec.image_size), b))
        .with_options(pipeline_options(spec, replicas))
    )

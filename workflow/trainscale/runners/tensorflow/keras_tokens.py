"""The Keras loop's token data: the windows the PyTorch loops train and score on
(trainscale.data.tokens), as `tf.data` pipelines of int32 ids (batch, seq_len) and their
next-token targets.

Every strategy sees the same tokens in the same order: a batch of rank r of `world` is what
`tokens.TrainWindows(rank=r, world=world)` yields in torch's loops. A process that feeds a
tf.distribute strategy the global batch (tf, tf-mirrored, tf-multiworker) stacks every rank's
batch in rank order, and the strategy hands replica r rows [r·b, (r + 1)·b): rank r's windows,
as torch-ddp's rank r reads them. A Horovod worker feeds its own rank's batch.

The batches come from a Python generator over the windows (one fancy index into the ids, a
memory-mapped file for the user's tokens, as torch's loader does), prefetched by tf.data on
its own thread: the ids of a user's file need not fit in memory or in a graph. The test split
(at most config eval_tokens) is cut into windows once, in memory. Ids stay int32 under every
precision policy: the policy casts the model's floats, never its inputs' ids.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import itertools  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainscale.data import tokens  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402
from trainscale.runners.tensorflow.keras_data import pipeline_options  # noqa: E402


class TokenTrain:
    """The training windows of `ranks` of `world` data-parallel ranks, `batch` windows each per
    step, stacked in rank order; `steps` per epoch (every rank's, cut to `steps_per_epoch`) and
    `count` (the windows of an epoch over all ranks: the record's train_samples)."""

    def __init__(self, spec: RunSpec, ranks: Sequence[int], world: int, batch: int) -> None:
        ids = tokens.spec_ids(spec, "train")
        self.seq_len = spec.seq_len
        self.parts = [
            tokens.TrainWindows(ids, spec.seq_len, batch, r, world, spec.seed, spec.scale)
            for r in ranks
        ]
        self.rows = batch * len(self.parts)
        self.count = self.parts[0].count
        self.steps = self.parts[0].steps
        if spec.steps_per_epoch is not None:
            self.steps = min(self.steps, spec.steps_per_epoch)

    def batches(self, first_epoch: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, targets) as int32, `steps` per epoch, epochs from `first_epoch` on (numbered
        from 1, as torch's loop numbers them), without end."""
        for epoch in itertools.count(first_epoch):
            ranks = [itertools.islice(w.epoch(epoch), self.steps) for w in self.parts]
            for step in zip(*ranks, strict=True):
                if len(step) == 1:
                    (x, y), = step  # fmt: skip
                else:
                    x, y = (np.concatenate(part) for part in zip(*step, strict=True))
                yield x.astype(np.int32), y.astype(np.int32)

    def dataset(self, spec: RunSpec, replicas: int, epochs_done: int = 0) -> tf.data.Dataset:
        """What `model.fit` reads: the batches from epoch `epochs_done + 1` on (a restarted
        elastic fit goes on where its last committed epoch ended), without end."""
        window = tf.TensorSpec((self.rows, self.seq_len), tf.int32)
        return (
            tf.data.Dataset.from_generator(
                lambda: self.batches(epochs_done + 1), output_signature=(window, window)
            )
            .apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
            .prefetch(2)
            .with_options(pipeline_options(spec, replicas))
        )


def eval_windows(spec: RunSpec, rank: int = 0, world: int = 1) -> tokens.EvalWindows:
    """Rank `rank`'s share of the test split's windows (every world-th, as torch's ranks
    score them; the whole split for rank 0 of 1)."""
    ids = tokens.spec_ids(spec, "test")
    return tokens.EvalWindows(
        ids, spec.seq_len, spec.per_worker_batch_size, rank, world, spec.eval_tokens
    )


def eval_dataset(
    spec: RunSpec, batch: int, replicas: int, rank: int = 0, world: int = 1
) -> tf.data.Dataset | None:
    """Rank `rank` of `world`'s test windows in batches of `batch` (the last one short), as
    int32 ids and targets; None where the rank holds no window."""
    windows = eval_windows(spec, rank, world)
    if len(windows.mine) == 0:
        return None
    x, y = tokens.window_batch(windows.ids, windows.mine, spec.seq_len)
    return (
        tf.data.Dataset.from_tensor_slices((x.astype(np.int32), y.astype(np.int32)))
        .batch(batch)
        .with_options(pipeline_options(spec, replicas))
    )

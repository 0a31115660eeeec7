"""The Keras loop's evaluation: loss and confusion matrix over the whole test set, accuracy
and per-class figures derived from them (trainscale.measure.classes), as the PyTorch loop records
them.

The confusion is a Keras metric (`Confusion`) on a scoring model (`scorer`) that wraps the
trained network and shares its weights: compiled apart from the training model, so the
matrix costs nothing in training steps, only in evaluations. Its counts are a metric's
sum-on-read variables, so under a tf.distribute strategy Keras sums them over replicas and
workers as it does the loss; a worker that scores its own share outside any strategy
(Horovod) sums them itself (`scores_of(..., all_sum)`).

A plug-in's `evaluate` returns `scores_of(...)`'s dict; that is all a new Keras strategy
needs to record `test.confusion` (and so `test.per_class_accuracy`).

On token data (a GPT's logits (B, T, V)) the metric is `TokenTally` instead: the sums torch's
`tally` keeps, [loss sum, correct next ids, tokens], summed over replicas and workers the same
way, whence next-token accuracy, loss and perplexity (measure.classes.token_scores). No
confusion: over a vocabulary of 50,304 it would be 2.5 billion counts.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale.measure.classes import scores, token_scores  # noqa: E402

#: Test batches one call of the scorer's compiled function takes (Keras' `steps_per_execution`).
#: One step per call costs a Python round trip and, under MultiWorkerMirroredStrategy, a
#: cross-worker exchange per batch: a tf-multiworker gpt-nano run spent 22 s scoring 1,619
#: test windows, against 2 s for the same under torch-ddp. The sums are the same either way.
STEPS_PER_EXECUTION = 64


class Confusion(keras.metrics.Metric):
    """Counts of (true class, argmax of the logits) pairs: rows true, columns predicted."""

    def __init__(self, classes: int, name: str = "confusion", **kw) -> None:
        super().__init__(name=name, **kw)
        self.classes = classes
        self.counts = self.add_weight(
            name="counts", shape=(classes, classes), initializer="zeros", dtype=tf.float64
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        true = tf.reshape(tf.cast(y_true, tf.int64), [-1])
        pred = tf.argmax(y_pred, axis=-1, output_type=tf.int64)
        pairs = tf.math.confusion_matrix(true, pred, num_classes=self.classes, dtype=tf.float64)
        return self.counts.assign_add(pairs)

    def result(self):
        return tf.identity(self.counts)

    def reset_state(self) -> None:
        self.counts.assign(tf.zeros_like(self.counts))

    def get_config(self) -> dict:
        return {**super().get_config(), "classes": self.classes}


class TokenTally(keras.metrics.Metric):
    """[sum of next-token cross-entropies, correct next ids (argmax), tokens] over every
    scored position of (B, T) targets and (B, T, V) logits, in float64 (as torch's `tally`)."""

    def __init__(self, name: str = "tokens", **kw) -> None:
        super().__init__(name=name, **kw)
        self.sums = self.add_weight(name="sums", shape=(3,), initializer="zeros", dtype=tf.float64)

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = tf.cast(y_true, tf.int64)
        logits = tf.cast(y_pred, tf.float32)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_true, logits=logits)
        hits = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int64), y_true)
        batch = tf.stack([
            tf.reduce_sum(tf.cast(loss, tf.float64)),
            tf.reduce_sum(tf.cast(hits, tf.float64)),
            tf.cast(tf.size(y_true), tf.float64),
        ])  # fmt: skip
        return self.sums.assign_add(batch)

    def result(self):
        return tf.identity(self.sums)

    def reset_state(self) -> None:
        self.sums.assign(tf.zeros_like(self.sums))


class Scorer(keras.Model):
    """The trained network in inference mode, under its own compile (loss + confusion only)."""

    def __init__(self, net: keras.Model) -> None:
        super().__init__()
        self.net = net

    def call(self, x, training=False):
        return self.net(x, training=False)


def scorer(net: keras.Model, classes: int, tokens: bool = False) -> keras.Model:
    """A scoring model sharing `net`'s weights; build it in the scope `net` was built in. On
    `tokens` it has no loss of its own: `TokenTally` sums the loss (Keras' would be computed
    over the (B, T, V) logits a second time)."""
    model = Scorer(net)
    if tokens:
        model.compile(metrics=[TokenTally()], steps_per_execution=STEPS_PER_EXECUTION)
        return model
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[Confusion(classes)],
        steps_per_execution=STEPS_PER_EXECUTION,
    )
    return model


def scores_of(
    model: keras.Model,
    dataset: tf.data.Dataset | None,
    classes: int,
    all_sum: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict:
    """The `test` block's accuracy, loss and confusion from `model.evaluate` (a `scorer`) over
    `dataset`; `all_sum` adds this worker's [loss sum, counts...] to the other workers' where
    each scores its own share outside a strategy (None: nothing to score here, zeros)."""
    if dataset is not None:
        res = model.evaluate(dataset, verbose=0, return_dict=True)
        confusion = np.asarray(res["confusion"], dtype=np.float64)
        loss_sum = float(res["loss"]) * confusion.sum()  # Keras' loss: the mean per sample
    else:
        confusion, loss_sum = np.zeros((classes, classes)), 0.0
    if all_sum is not None:
        total = all_sum(np.concatenate([[loss_sum], confusion.ravel()]))
        loss_sum, confusion = float(total[0]), np.asarray(total[1:]).reshape(classes, classes)
    return scores(confusion.tolist(), loss_sum)


def token_scores_of(
    model: keras.Model,
    dataset: tf.data.Dataset | None,
    all_sum: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict:
    """The `test` block's next-token accuracy, loss and perplexity from `model.evaluate` (a
    token `scorer`) over `dataset`; `all_sum` adds this worker's sums to the other workers'
    where each scores its own share outside a strategy (None: nothing to score here)."""
    sums = np.zeros(3)
    if dataset is not None:
        sums = np.asarray(model.evaluate(dataset, verbose=0, return_dict=True)["tokens"])
    if all_sum is not None:
        sums = np.asarray(all_sum(sums.astype(np.float64)))
    return token_scores(*(float(v) for v in sums))

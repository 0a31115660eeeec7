"""Per-class test scores, framework-neutral: what a confusion matrix says and what the classes
are called.

Every loop's evaluation (runners/torch/torch_parts.py, runners/tensorflow/keras_eval.py) counts one
confusion matrix over the whole test set (rows = true class, columns = predicted class; summed over
ranks) beside the loss sum, and hands both to `scores`, so accuracy is the matrix's diagonal
over its total, exactly, in every framework. `Recorder.record` (trainscale.measure.metrics) then
adds the per-class accuracy and the class names with `per_class_block`: each is defined here once.

Class names are recorded in the metrics (`test.class_names`), so the report needs no data set
knowledge: CIFAR-10's ten names, "0".."9" for digits and MNIST, an image folder's sub-folder
names (its labels are their sorted positions, trainscale.data.imagesets), the label numbers of a
WebDataset; none for synthetic data, whose random labels make accuracy meaningless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CIFAR10_NAMES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
DIGIT_NAMES: tuple[str, ...] = tuple(str(i) for i in range(10))
NAMES: dict[str, tuple[str, ...]] = {
    "cifar10": CIFAR10_NAMES,
    "digits": DIGIT_NAMES,
    "mnist": DIGIT_NAMES,
}
#: the per-class keys of the `test` block; null where there is no labelled evaluation
PER_CLASS_KEYS: tuple[str, ...] = ("confusion", "per_class_accuracy", "class_names")


def scores(confusion: Sequence[Sequence[float]], loss_sum: float) -> dict:
    """The `test` block's figures from a confusion matrix of counts (rows true, columns
    predicted) and the summed per-sample loss: accuracy = diagonal / total, mean loss, and the
    matrix as integers."""
    counts = [[round(v) for v in row] for row in confusion]
    total = sum(map(sum, counts))
    if total == 0:
        raise ValueError("the confusion matrix counts no test sample")
    correct = sum(row[i] for i, row in enumerate(counts))
    return {"accuracy": correct / total, "loss": loss_sum / total, "confusion": counts}


def token_scores(loss_sum: float, correct: float, tokens: float) -> dict:
    """The `test` block of a token set, from sums over every scored next-token prediction:
    next-token accuracy (argmax = the next id), mean cross-entropy per token, and perplexity =
    exp(mean loss). No confusion: a vocabulary of 50,304 would make it 2.5 billion counts."""
    if tokens == 0:
        raise ValueError("the evaluation scored no token")
    loss = loss_sum / tokens
    return {"accuracy": correct / tokens, "loss": loss, "perplexity": math.exp(min(loss, 700))}


def per_class_accuracy(confusion: Sequence[Sequence[int]]) -> list[float | None]:
    """Each true class's share of its test samples predicted as itself (its recall), by class
    index; None for a class with no test sample."""
    return [row[i] / sum(row) if sum(row) else None for i, row in enumerate(confusion)]


def class_names(spec: dict) -> list[str] | None:
    """The names of a run's classes by label index (spec: RunSpec.to_dict()); None for synthetic
    data."""
    source = spec.get("image_source")
    if source is not None:
        if source["format"] == "imagefolder":
            from trainscale.data.imagesets import folder_classes

            return folder_classes(source["train"])
        return [str(i) for i in range(source["classes"])]
    name = spec["dataset"]
    if name in NAMES:
        return list(NAMES[name])
    return None  # synthetic data: random labels


def per_class_block(test: dict, spec: dict) -> dict:
    """A loop's `test` block completed: `per_class_accuracy` and `class_names` from its
    `confusion` (all three null where the loop recorded none)."""
    confusion = test.get("confusion")
    if confusion is None:
        return {**test, **dict.fromkeys(PER_CLASS_KEYS)}
    return {
        **test,
        "per_class_accuracy": per_class_accuracy(confusion),
        "class_names": class_names(spec),
    }

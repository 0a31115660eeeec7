"""`matrix.exclude`: the cells it drops, and the pairs of a model and a data set it leaves any
cell of.

The checks of a model against a data set run before any job and stop the whole study: an
`hf:` config's vocabulary against a token set's ids, an own model's pre-flight build at a data
set's shape. A study that pairs two vocabularies with two token sets, and excludes each pair
that does not fit, must not stop on a pair that never runs; so those checks look only at the
(model, data set, seq_len) that `pairs_left` gives: those with at least one cell of the matrix
left after `exclude`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

#: the matrix keys a model × data check depends on
PAIR_KEYS = ("model", "dataset", "seq_len")


def excluded(values: Mapping, exclude: list[dict]) -> bool:
    """Whether a cell of these matrix `values` matches every key of one rule of `exclude`."""
    return any(all(values.get(k) == v for k, v in rule.items()) for rule in exclude)


def pairs_left(
    axes: Mapping[str, list], exclude: list[dict], tokens: Mapping[str, bool]
) -> set[tuple[str, str, int]]:
    """The (model, data set, seq_len) of the matrix `axes` (each key's values) that keep at
    least one cell after `exclude`; an image data set's seq_len is 0, as its cells' are.
    `tokens`: whether each data set is token data."""
    left = set()
    for model, dataset in itertools.product(axes["model"], axes["dataset"]):
        for seq_len in axes["seq_len"] if tokens[dataset] else [0]:
            pair = {"model": model, "dataset": dataset, "seq_len": seq_len}
            if _any_cell_left(pair, axes, exclude):
                left.add((model, dataset, seq_len))
    return left


def _any_cell_left(pair: dict, axes: Mapping[str, list], exclude: list[dict]) -> bool:
    """Whether some cell of `pair` escapes `exclude`: only the rules that match the pair can
    drop its cells, and only their other keys' values need trying (an axis the matrix lacks
    matches no rule: its cells are left)."""
    rules = [r for r in exclude if all(r[k] == pair[k] for k in PAIR_KEYS if k in r)]
    keys = sorted({k for rule in rules for k in rule} - set(PAIR_KEYS))
    for values in itertools.product(*(axes.get(k) or [None] for k in keys)):
        if not excluded({**pair, **dict(zip(keys, values, strict=True))}, rules):
            return True
    return False

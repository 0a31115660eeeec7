"""The flags a cell carries beside its numbers, worded once for every place that shows them:
summary.txt, the report's tables and ranking figure, a scaling card's notes and a tune's
excluded cells."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from trainscale.measure.datawait import INPUT_BOUND_SHARE

__all__ = ["INPUT_BOUND", "LOGICAL", "OVERSUBSCRIBED", "Flag", "cell_flags"]


@dataclass(frozen=True)
class Flag:
    label: str  # the short mark beside a row or a bar: "logical devices"
    note: str  # what the mark means, as a note, a tooltip or a line of summary.txt


OVERSUBSCRIBED = Flag("oversubscribed", "oversubscribed: more worker threads than cores on a node")
LOGICAL = Flag(
    "logical devices", "logical CPU devices in one process: a code-path check, not a speed-up"
)
#: Marked in the report's scaling table only (scaling.csv `input_bound`), not among
#: `cell_flags`: summary.txt and the ranking give the data-wait share itself.
INPUT_BOUND = Flag(
    "input-bound", f"data wait above {100 * INPUT_BOUND_SHARE:.0f}% of the steady epoch"
)


def cell_flags(row: Any) -> list[Flag]:
    """The flags of one cell, in the order every place shows them: `row` is a row of scaling.csv
    (as `itertuples` gives it, or a mapping); a column it lacks, or a null, is no flag."""
    return [
        flag
        for flag, column in ((OVERSUBSCRIBED, "oversubscribed"), (LOGICAL, "logical"))
        if _is_set(row.get(column) if isinstance(row, Mapping) else getattr(row, column, None))
    ]


def _is_set(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and pd.isna(value)) and bool(value)

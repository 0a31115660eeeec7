"""A cell's row of a comparison as `verdicts` makes it, typed until the result is written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CellRow:
    """A cell of BASE and NEW: both sides, the throughput ratio with its CI and verdict (or
    why it is not comparable), what changed beside it, and the cost's, where priced (the
    fields in the order compare's JSON gives them)."""

    cell: dict[str, Any]  # its matrix values, CELL's keys
    label: str
    base: dict[str, Any] | None  # `Side.summary()` of each side; None: missing there
    new: dict[str, Any] | None
    ratio: float | None = None  # NEW / BASE of the geometric means
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str = "not comparable"
    reason: str = ""  # why it is not comparable
    ci: str | None = None  # how its CI was made: steps, bootstrap or welch
    accuracy_change: float | None = None  # points
    memory_change: float | None = None  # NEW / BASE − 1 of the peak
    memory: str | None = None  # the peak compared: device or host RSS
    notes: list[str] = field(default_factory=list)
    cost_ratio: float | None = None
    cost_ci_low: float | None = None
    cost_ci_high: float | None = None
    cost_verdict: str | None = None  # None: no prices given
    cost_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

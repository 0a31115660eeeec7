"""A comparison as `verdicts` and `references` make it: each cell's row, typed until the
result is assembled, and the result itself, typed until it is written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA_ID = "trainscale.compare/1"
VERDICTS = ("slower", "faster", "same", "not comparable")


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


@dataclass(frozen=True)
class Comparison:
    """A comparison's result: what was compared, every cell's row (as the JSON gives it) and
    the tally of verdicts; `mode` compare (BASE against NEW) or reference (one study against
    a references file)."""

    mode: str
    base: dict[str, Any]  # source, study, runs
    new: dict[str, Any]
    threshold: float | None  # compare's
    ci: str | None  # compare's --ci
    cells: list[dict[str, Any]]
    environment: list[dict[str, str]]  # compare's machine and config differences
    failures: dict[str, Any]  # each side's card's failures
    currency: str | None = None  # compare's, with prices
    out_of_bounds: list[str] = field(default_factory=list)  # a reference check's

    @property
    def reference(self) -> bool:
        return self.mode == "reference"

    @property
    def counts(self) -> dict[str, int]:
        return {v: sum(r["verdict"] == v for r in self.cells) for v in VERDICTS}

    @property
    def slower(self) -> list[str]:
        return [r["label"] for r in self.cells if r["verdict"] == "slower"]

    @property
    def dearer(self) -> list[str]:
        return [r["label"] for r in self.cells if r.get("cost_verdict") == "dearer"]

    @property
    def exit_status(self) -> int:
        """1 when a cell is slower or dearer (outside its bounds, for references), else 0."""
        failed = self.out_of_bounds if self.reference else self.slower + self.dearer
        return 1 if failed else 0

    def to_json(self) -> dict[str, Any]:
        """compare's JSON (schema trainscale.compare/1)."""
        head = {"schema": SCHEMA_ID, "mode": self.mode, "base": self.base, "new": self.new,
                "threshold": self.threshold, "ci": self.ci}  # fmt: skip
        if not self.reference:
            head["currency"] = self.currency
        body = {"cells": self.cells, "environment": self.environment, "failures": self.failures}
        if self.reference:
            body["out_of_bounds"] = self.out_of_bounds
        return {**head, **body, "counts": self.counts, "slower": self.slower,
                "dearer": self.dearer, "exit_status": self.exit_status}  # fmt: skip

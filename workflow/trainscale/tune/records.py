"""A tune's files as typed records: round 0's plan (round~0/space.json) and each round's
result (round~R/round.json), parsed once where the JSON is read and written back as it was.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainscale.tune.race import BEST, Settings

#: A cell's matrix values by MATRIX_KEYS name (None where the key does not apply).
Values = Mapping[str, Any]


@dataclass(frozen=True)
class TriedCell:
    """A cell round 0 tries: the study's first run of it, without the repeat."""

    cell: str  # its run path without the repeat: its id
    values: Values  # its matrix values
    world_size: int
    panel: list  # its panel's values (space.PANELS of the objective)
    panel_label: str  # how the report names the panel: "seed-small · digits · N=2"
    stratum: str  # its stratum of the run-to-run variance
    reason: str  # why it is tried: the memory predicted, where it was


@dataclass(frozen=True)
class DroppedCell:
    """A combination round 0 drops, with the reason."""

    values: Values
    reason: str


@dataclass(frozen=True)
class Grid:
    """The study's own runs, whose cost the tune predicts."""

    epochs: int
    steps_per_epoch: int | None
    repeats: int


@dataclass(frozen=True)
class RoundZero:
    """Round 0 as the rounds read it: the cells tried and dropped, and how to run them."""

    study: str
    settings: Settings
    next: dict[str, list[int]]  # round 1's repeats of each cell
    max_repeats: int
    grid: Grid
    cost: Mapping[str, Any]  # config `cost`, as the study gave it
    cells: list[TriedCell]
    dropped: list[DroppedCell]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundZero:
        return cls(
            study=data["study"],
            settings=Settings(**data["settings"]),
            next={c: list(r) for c, r in data["next"].items()},
            max_repeats=data["max_repeats"],
            grid=Grid(**data["grid"]),
            cost=data.get("cost") or {},
            cells=[TriedCell(**c) for c in data["cells"]],
            dropped=[DroppedCell(**d) for d in data["dropped"]],
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def currency(self) -> str:
        return self.cost.get("currency") or "USD"


@dataclass(frozen=True)
class CellDecision:
    """A cell's row of a round: what the race decided and its estimate in the objective's
    unit (None where not finite)."""

    cell: str
    values: Values
    world_size: int
    panel: str  # the panel's label
    runs: int  # its runs so far, every round's
    ran: int  # its runs in this round
    ok: int  # its ok runs so far
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    score: float | None  # the log objective the race ranks by, higher better
    worker_seconds: float | None  # spent on it in this round
    grid_seconds: float | None  # one of the study's own runs of it, predicted
    price: float | None  # one device-hour's price
    unit: str
    decision: str  # go on, stopped or best
    reason: str

    @property
    def won(self) -> bool:
        return self.decision == BEST


@dataclass(frozen=True)
class FailedRun:
    """A run of a round that was not ok, or no valid record."""

    cell: str
    repeat: int
    status: str
    error: str


@dataclass(frozen=True)
class Round:
    """A round's result (round~R/round.json)."""

    round: int
    steady_epochs: int
    steps_per_epoch: int
    cells: list[CellDecision]
    failed: list[FailedRun]
    runs: int  # the round's runs
    worker_seconds: float  # spent by the round's runs
    spent_runs: int  # every round's so far
    spent_worker_seconds: float
    next: dict[str, list[int]]  # the next round's repeats of each cell going on
    done: str | None  # why the tune ends here; None: it goes on

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Round:
        fields = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in data.items() if k in fields}
        return cls(
            **{
                **given,
                # a round written before `ran`: every cell ran in it
                "cells": [CellDecision(**{"ran": 1, **c}) for c in data["cells"]],
                "failed": [FailedRun(**f) for f in data["failed"]],
            }
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def last_decisions(rounds: list[Round]) -> dict[str, CellDecision]:
    """Each cell's row of the last round it appears in, in the order cells first appear."""
    return {c.cell: c for r in rounds for c in r.cells}


def read_round_zero(path: str | Path) -> RoundZero:
    """round~0/space.json."""
    return RoundZero.from_json(json.loads(Path(path).read_text()))


def read_round(path: str | Path) -> Round:
    """A round~R/round.json."""
    return Round.from_json(json.loads(Path(path).read_text()))


def write_json(path: str | Path, record: RoundZero | Round) -> None:
    """A round's file as the next rounds and the workflow read it."""
    Path(path).write_text(json.dumps(record.to_json(), indent=1) + "\n")

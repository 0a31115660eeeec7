"""Round 0 of a tune: the search space, and the run spec of every cell in every round.

The cells are the study's own, as the workflow planned them (rules/common.smk: the matrix, its
rules and the memory model); this module adds what the tune needs: the cells the memory model
predicts over the limit dropped even where memory.check: warn keeps them, the panels, how many
times round 1 runs a cell, and each round's run specs (`evaluate: false`, one warm-up epoch,
more steady epochs each round). Every import the tune makes from `trainscale.plan` is here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from trainscale.analysis.interval import MIN_DF
from trainscale.plan.faults import fault_for
from trainscale.plan.matrix import effective_lr
from trainscale.plan.prices import Prices
from trainscale.plan.runspec import DIVERGE_LR, MATRIX_KEYS, ConfigError, Dropped, RunSpec

__all__ = ["MATRIX_KEYS", "ConfigError", "Prices", "Settings", "Space", "cell_of", "plan"]

GIB = 2**30
#: The panel keys of each objective: the cells compared with each other.
PANELS = {"throughput": ("model", "dataset", "world_size"), "cost": ("model", "dataset")}


@dataclass(frozen=True)
class Settings:
    """Config `tune:` with its defaults (workflow/schemas/config.schema.yaml)."""

    objective: str = "throughput"
    max_worker_hours: float | None = None
    max_runs: int | None = None
    eta: int = 3
    steps_per_epoch: int = 40

    @classmethod
    def of(cls, config: dict) -> Settings:
        given = config.get("tune") or {}
        return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given})

    def steady_epochs(self, round: int) -> int:
        """Steady epochs of a run of `round`: 1 in round 1, eta^(R-1) in round R."""
        return self.eta ** (round - 1)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cell_of(run_path: str) -> str:
    """A cell's id: its run path without the repeat."""
    return run_path.rsplit("/repeat~", 1)[0]


def panel_of(values: dict, objective: str) -> list:
    """The panel of a cell's matrix `values` (with world_size) under `objective`."""
    return [values[k] for k in PANELS[objective]]


def panel_label(panel: list, objective: str) -> str:
    """How the report names a panel: "seed-small · digits · N=2"."""
    parts = [f"N={v}" if k == "world_size" else str(v)
             for k, v in zip(PANELS[objective], panel, strict=True)]  # fmt: skip
    return " · ".join(parts)


@dataclass
class Space:
    """The tune's cells (by id: each the study's first run of the cell), the combinations
    round 0 drops with their reasons, and how each round runs them."""

    study: str
    settings: Settings
    cells: dict[str, RunSpec]
    kept: dict[str, str]  # cell -> why it is tried (the memory predicted, where it was)
    dropped: list[Dropped]
    base_batch_size: int
    faults: list[dict]
    grid: dict  # the study's own runs: epochs, steps_per_epoch, repeats
    cost: dict  # config `cost`: the prices of a device-hour
    _specs: dict = field(default_factory=dict, repr=False)  # (cell, round, repeat) -> spec

    @property
    def first_repeats(self) -> int:
        """Runs of each cell in round 1: two, or more where the tune has so few cells that the
        run-to-run variance pooled over them would have fewer than MIN_DF degrees of freedom
        (each cell gives repeats − 1)."""
        n = len(self.cells)
        return 2 if n < 2 else max(2, 1 + math.ceil(MIN_DF / n))

    def repeats(self, round: int) -> list[int]:
        """The repeat numbers a cell runs in `round` (numbered across rounds)."""
        if round == 1:
            return list(range(self.first_repeats))
        return [self.first_repeats + round - 2]

    def run_paths(self, cell: str, round: int) -> list[str]:
        return [f"{cell}/repeat~{r}" for r in self.repeats(round)]

    @property
    def max_rounds(self) -> int:
        """The most rounds the stop rule can take: halving the largest panel to 2 cells, then
        the round that ends it (a round after the first that stops none ends a panel)."""
        sizes: dict[tuple, int] = {}
        for spec in self.cells.values():
            values = {k: getattr(spec, k) for k in ("model", "dataset", "world_size")}
            key = tuple(panel_of(values, self.settings.objective))
            sizes[key] = sizes.get(key, 0) + 1
        n, rounds = max(sizes.values(), default=1), 1
        while n > 2:
            n, rounds = max(2, math.ceil(n / self.settings.eta)), rounds + 1
        return max(rounds, 2)

    def study_spec(self, run_path: str) -> RunSpec:
        """The study's own first run of the cell of a tune run: the tune run's input files
        and SLURM request are its, and so is its memory prediction."""
        return self.cells[cell_of(run_path)]

    def spec(self, round: int, run_path: str) -> RunSpec:
        """The run spec behind `run_path` in `round`; ValueError naming it where the tune has
        no such run."""
        cell, _, repeat = run_path.rpartition("/repeat~")
        if cell not in self.cells or not repeat.isdigit() or int(repeat) not in self.repeats(round):
            raise ValueError(
                f"{run_path} is not a run of round {round} of study {self.study!r}'s tune"
            )
        key = (cell, round, int(repeat))
        if key not in self._specs:
            self._specs[key] = self._spec(*key)
        return self._specs[key]

    def _spec(self, cell: str, round: int, repeat: int) -> RunSpec:
        base = self.cells[cell]
        values = {k: getattr(base, k) for k in MATRIX_KEYS}
        fault = fault_for(values, repeat, self.faults)
        lr = effective_lr(base.base_lr, base.lr_scaling, base.global_batch_size,
                          self.base_batch_size)  # fmt: skip
        return dataclasses.replace(
            base,
            repeat=repeat,
            seed=base.seed - base.repeat + repeat,
            epochs=1 + self.settings.steady_epochs(round),
            steps_per_epoch=self.settings.steps_per_epoch,
            evaluate=False,
            fault=fault,
            lr=DIVERGE_LR if fault and fault.kind == "diverge" else lr,
        )

    def runs(self, round: int) -> list[tuple[str, RunSpec]]:
        """(run path, spec) of every run every cell could have in `round`."""
        return [(p, self.spec(round, p)) for c in self.cells for p in self.run_paths(c, round)]

    def to_json(self) -> dict:
        """Round 0 as the rounds read it (results/<study>/tune/round~0/space.json)."""
        objective = self.settings.objective
        cells = []
        for cell, spec in self.cells.items():
            values = {k: getattr(spec, k) for k in MATRIX_KEYS}
            panel = panel_of({**values, "world_size": spec.world_size}, objective)
            cells.append({"cell": cell, "values": values, "world_size": spec.world_size,
                          "panel": panel, "panel_label": panel_label(panel, objective),
                          "reason": self.kept[cell]})  # fmt: skip
        dropped = [{"values": {k: d.values.get(k) for k in MATRIX_KEYS}, "reason": d.reason}
                   for d in self.dropped]  # fmt: skip
        return {
            "study": self.study,
            "settings": self.settings.to_dict(),
            "first_repeats": self.first_repeats,
            "max_rounds": self.max_rounds,
            "grid": self.grid,
            "cost": self.cost,
            "cells": cells,
            "dropped": dropped,
        }


def plan(
    config: dict, runs: list[RunSpec], dropped: list[Dropped], predicted: dict[str, dict]
) -> Space:
    """Round 0: the study's planned `runs` (after the memory model's `fit`) and `dropped`
    combinations, and each run's `memory.predicted` block by path (empty where memory.check
    is off); ConfigError where tune.max_runs cannot pay for round 1."""
    settings = Settings.of(config)
    cells: dict[str, RunSpec] = {}
    for r in runs:
        cells.setdefault(cell_of(r.path), r)
    dropped, kept = list(dropped), {}
    for cell, spec in list(cells.items()):
        over, why = memory_verdict(predicted.get(spec.path))
        if over:
            values = {k: getattr(spec, k) for k in MATRIX_KEYS}
            dropped.append(Dropped(values, f"{why} (memory.check: warn keeps it in the study; "
                                   "a tune tries nothing predicted not to fit)"))  # fmt: skip
            del cells[cell]
        else:
            kept[cell] = why
    if not cells:
        raise ConfigError("tune: every cell of the matrix is predicted over the memory limit")
    space = Space(
        study=config["study"],
        settings=settings,
        cells=cells,
        kept=kept,
        dropped=dropped,
        base_batch_size=config["base_batch_size"],
        faults=config.get("faults") or [],
        grid={
            "epochs": config["epochs"],
            "steps_per_epoch": config.get("steps_per_epoch"),
            "repeats": config["repeats"],
        },  # fmt: skip
        cost=config.get("cost") or {},
    )
    first = space.first_repeats * len(cells)
    if settings.max_runs is not None and settings.max_runs < first:
        raise ConfigError(
            f"tune.max_runs {settings.max_runs}: round 1 runs each of the {len(cells)} cells "
            f"{space.first_repeats} times ({first} runs); raise it to at least {first}, or "
            "narrow matrix"
        )
    return space


def memory_verdict(block: dict | None) -> tuple[bool, str]:
    """(whether a cell's `memory.predicted` block puts it over limit × headroom, the words
    tune.csv's round 0 says of it)."""
    kept = "kept by the matrix's rules"
    if not block:
        return False, kept
    need, limit = block.get("total_bytes"), block.get("limit_bytes")
    if block.get("error") or need is None:
        return False, f"{kept}; memory not predicted ({block.get('error') or 'no estimate'})"
    if limit is None:
        return False, f"{kept}; predicted {need / GIB:.3g} GiB per rank (no limit given)"
    allowed = limit * block.get("headroom", 1.0)
    said = f"predicted {need / GIB:.3g} GiB per rank, allowed {allowed / GIB:.3g} GiB"
    return need > allowed, said if need > allowed else f"{kept}; {said}"

"""Round 0 of a tune: the search space, and the run spec of every cell in every round.

The cells are the study's own, as the workflow planned them (rules/common.smk: the matrix, its
rules and the memory model); this module adds what the tune needs: the cells the memory model
predicts over the limit dropped even where memory.check: warn keeps them, the panels, how many
times round 1 runs a cell, and each round's run specs (`evaluate: false`, one warm-up epoch,
more steady epochs each round). Every import the tune makes from `trainscale.plan` is here
and in `budget` (round 1's predicted cost).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trainscale.analysis.interval import stratum_of
from trainscale.plan.faults import fault_for
from trainscale.plan.matrix import effective_lr, repeat_count
from trainscale.plan.prices import Prices
from trainscale.plan.runspec import DIVERGE_LR, MATRIX_KEYS, ConfigError, Dropped, RunSpec
from trainscale.tune import budget, race
from trainscale.tune.race import Settings
from trainscale.tune.records import DroppedCell, Grid, RoundZero, TriedCell, Values

__all__ = ["MATRIX_KEYS", "ConfigError", "Prices", "Settings", "Space", "cell_of", "plan"]

GIB = 2**30
#: The panel keys of each objective: the cells compared with each other.
PANELS = {"throughput": ("model", "dataset", "world_size"), "cost": ("model", "dataset")}


def cell_of(run_path: str) -> str:
    """A cell's id: its run path without the repeat."""
    return run_path.rsplit("/repeat~", 1)[0]


def panel_of(values: Values, objective: str) -> list:
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
    grid: Grid  # the study's own runs: epochs, steps_per_epoch, repeats
    cost: dict  # config `cost`: the prices of a device-hour
    _specs: dict = field(default_factory=dict, repr=False)  # (cell, round, repeat) -> spec

    def panel_sizes(self) -> dict[str, int]:
        """Each cell's panel's count of cells."""
        labels = {c: self.panel_label(c) for c in self.cells}
        counts = {p: list(labels.values()).count(p) for p in set(labels.values())}
        return {c: counts[p] for c, p in labels.items()}

    def panel_label(self, cell: str) -> str:
        spec = self.cells[cell]
        values = {k: getattr(spec, k) for k in MATRIX_KEYS}
        return panel_label(panel_of({**values, "world_size": spec.world_size},
                                    self.settings.objective), self.settings.objective)  # fmt: skip

    def first_runs(self) -> dict[str, list[int]]:
        """Round 1's repeats of each cell: what the race asks before any evidence."""
        cells = [{"cell": c, "panel": self.panel_label(c), "stratum": self.stratum(c)}
                 for c in self.cells]  # fmt: skip
        empty = race.empty_evidence()
        unbounded = dataclasses.replace(self.settings, max_runs=None)  # plan checks it
        asked = race.decide(race.cells_frame(cells), empty, unbounded)
        return {c: list(range(n)) for c, n in zip(asked["cell"], asked["next_runs"], strict=True)}

    def first_round(self) -> budget.FirstRound:
        """Round 1's runs and the worker-seconds they spend, predicted (`budget`)."""
        asked = self.first_runs().items()
        return budget.first_round([self.spec(1, f"{c}/repeat~{r}") for c, rs in asked for r in rs])

    def stratum(self, cell: str) -> str:
        """The cell's stratum of the run-to-run variance (its device told by its records)."""
        spec = self.cells[cell]
        return stratum_of(spec.strategy, spec.world_size, "")

    @property
    def max_repeats(self) -> int:
        """The most runs a race can make of a cell: race.most_runs and its confirmation
        runs."""
        first = max((race.first_runs(n) for n in self.panel_sizes().values()), default=2)
        return race.most_runs(first) + self.settings.confirm

    def study_spec(self, run_path: str) -> RunSpec:
        """The study's own first run of the cell of a tune run: the tune run's input files
        and SLURM request are its, and so is its memory prediction."""
        return self.cells[cell_of(run_path)]

    def spec(self, number: int, run_path: str) -> RunSpec:
        """The run spec behind `run_path` in round `number`; ValueError naming it where the tune has
        no such run."""
        cell, _, repeat = run_path.rpartition("/repeat~")
        if cell not in self.cells or not repeat.isdigit() or int(repeat) >= self.max_repeats:
            raise ValueError(
                f"{run_path} is not a run of round {number} of study {self.study!r}'s tune"
            )
        key = (cell, number, int(repeat))
        if key not in self._specs:
            self._specs[key] = self._spec(*key)
        return self._specs[key]

    def _spec(self, cell: str, number: int, repeat: int) -> RunSpec:
        base = self.cells[cell]
        values = {k: getattr(base, k) for k in MATRIX_KEYS}
        fault = fault_for(values, repeat, self.faults)
        lr = effective_lr(base.base_lr, base.lr_scaling, base.global_batch_size,
                          self.base_batch_size)  # fmt: skip
        return dataclasses.replace(
            base,
            repeat=repeat,
            seed=base.seed - base.repeat + repeat,
            epochs=1 + self.settings.epochs,
            steps_per_epoch=self.settings.steps_per_epoch,
            evaluate=False,
            fault=fault,
            lr=DIVERGE_LR if fault and fault.kind == "diverge" else lr,
        )

    def every_run(self) -> list[RunSpec]:
        """The spec of every run the race could make."""
        reps = range(self.max_repeats)
        return [self.spec(1, f"{c}/repeat~{r}") for c in self.cells for r in reps]

    def to_json(self) -> dict:
        """Round 0 as the rounds read it (results/<study>/tune/round~0/space.json)."""
        return self.round_zero().to_json()

    def round_zero(self) -> RoundZero:
        """Round 0: the cells tried, with their panels, and the combinations dropped."""
        objective = self.settings.objective
        cells = []
        for cell, spec in self.cells.items():
            values = {k: getattr(spec, k) for k in MATRIX_KEYS}
            panel = panel_of({**values, "world_size": spec.world_size}, objective)
            cells.append(
                TriedCell(
                    cell=cell,
                    values=values,
                    world_size=spec.world_size,
                    panel=panel,
                    panel_label=panel_label(panel, objective),
                    stratum=self.stratum(cell),
                    reason=self.kept[cell],
                )
            )
        dropped = [
            DroppedCell({k: d.values.get(k) for k in MATRIX_KEYS}, d.reason) for d in self.dropped
        ]
        return RoundZero(
            study=self.study,
            settings=self.settings,
            next=self.first_runs(),
            max_repeats=self.max_repeats,
            grid=self.grid,
            cost=self.cost,
            cells=cells,
            dropped=dropped,
        )


def plan(
    config: dict, runs: list[RunSpec], dropped: list[Dropped], predicted: dict[str, dict]
) -> Space:
    """Round 0: the study's planned `runs` (after the memory model's `fit`) and `dropped`
    combinations, and each run's `memory.predicted` block by path (empty where memory.check
    is off); ConfigError where tune.max_runs or tune.max_worker_hours cannot pay for round 1."""
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
        grid=Grid(config["epochs"], config.get("steps_per_epoch"), repeat_count(config["repeats"])),
        cost=config.get("cost") or {},
    )
    first = sum(len(r) for r in space.first_runs().values())
    if settings.max_runs is not None and settings.max_runs < first:
        raise ConfigError(
            f"tune.max_runs {settings.max_runs}: round 1 runs the {len(cells)} cells "
            f"{first} times in all; raise it to at least {first}, or narrow matrix"
        )
    budget.check(space.first_round(), settings.max_worker_hours)
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

"""A tune's results from its rounds: tune.csv (every cell of every round, round 0's dropped
combinations among them), best.yaml (a study file of the winning set) and the figures the
report shows beside them (what the tune spent, what the grid would have cost).
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from trainscale.tune.evidence import HOUR
from trainscale.tune.records import CellDecision, Round, RoundZero, Values, last_decisions
from trainscale.tune.space import MATRIX_KEYS, Settings

#: tune.csv's columns: the round, the cell's matrix values, then what the round made of it.
COLUMNS = ["round", *MATRIX_KEYS, "world_size", "panel", "runs", "ok", "estimate", "ci_low",
           "ci_high", "unit", "decision", "reason", "worker_seconds", "cell"]  # fmt: skip
#: Config keys best.yaml leaves out: faults planted for a test of the harness strike runs by
#: their repeat, and a benchmark of the winners plants none.
LEFT_OUT = ("faults",)


def round_number(path: str | Path) -> int:
    """R of a path under results/<study>/tune/round~R/."""
    found = re.search(r"(?:^|/)round~(\d+)/", str(path))
    if not found:
        raise ValueError(f"{path}: not under a tune's round~R/ folder")
    return int(found.group(1))


def table(space: RoundZero, rounds: list[Round]) -> pd.DataFrame:
    """tune.csv: round 0 (the cells tried, the combinations dropped with their reasons), then
    one row per cell and round it ran in."""
    rows = []
    for c in space.cells:
        rows.append({"round": 0, **c.values, "world_size": c.world_size, "panel": c.panel_label,
                     "decision": "go on", "reason": c.reason, "cell": c.cell})  # fmt: skip
    for d in space.dropped:
        rows.append({"round": 0, **d.values, "world_size": d.values["workers"] * d.values["nodes"],
                     "decision": "stopped", "reason": d.reason})  # fmt: skip
    for r in rounds:
        for c in r.cells:
            decided = {k: v for k, v in vars(c).items() if k in COLUMNS and k != "round"}
            rows.append({"round": r.round, **c.values, **decided})
    return pd.DataFrame(rows, columns=COLUMNS).astype({"runs": "Int64", "ok": "Int64"})


def winners(rounds: list[Round]) -> list[CellDecision]:
    """The winning set: each cell whose last round decided `best`, in panel order."""
    won = (c for c in last_decisions(rounds).values() if c.won)
    return sorted(won, key=lambda c: (c.panel, -(c.score or -math.inf)))


def best_config(config: dict, cells: list[Values]) -> dict:
    """best.yaml: the study's config (`config`, as the workflow filled it) with the study
    named <study>-best and a matrix whose cells are exactly `cells` (their matrix values):
    each key's values over them, and every other combination of those values excluded (an
    image data set's cells have no seq_len)."""
    out = {k: copy.deepcopy(v) for k, v in config.items() if k not in LEFT_OUT}
    out["study"] = f"{config['study']}-best"
    values = {k: sorted({c[k] for c in cells}) for k in MATRIX_KEYS}
    tokens = {c["dataset"] for c in cells if c["seq_len"]}
    lengths = sorted({c["seq_len"] for c in cells if c["seq_len"]})
    matrix = {k: v for k, v in values.items() if k != "seq_len"}
    if lengths:
        matrix["seq_len"] = lengths
    many = [k for k in MATRIX_KEYS if len(matrix.get(k, [])) > 1]
    wanted = {tuple(c[k] for k in many if k != "seq_len" or c["dataset"] in tokens)
              for c in cells}  # fmt: skip
    exclude: list[dict] = []
    for combo in itertools.product(*(matrix[k] for k in many)):
        rule = dict(zip(many, combo, strict=True))
        if "seq_len" in rule and rule.get("dataset", values["dataset"][0]) not in tokens:
            del rule["seq_len"]  # an image data set: one cell for every seq_len
        if tuple(rule.values()) not in wanted and rule not in exclude:
            exclude.append(rule)
    matrix["exclude"] = exclude
    out["matrix"] = matrix
    return out


def write_best(path: str | Path, config: dict, cells: list[CellDecision], csv: str) -> None:
    """best.yaml, with a header that says what it is and how to run it; where no cell won
    (every run failed), a file that says so and sets nothing to run."""
    if not cells:
        Path(path).write_text(
            f"# trainscale tune of study {config['study']!r} found no winner: no cell had an ok "
            f"run ({csv} says why).\n# There is nothing to benchmark.\n"
        )
        return
    best = best_config(config, [c.values for c in cells])
    text = yaml.safe_dump(best, sort_keys=False, allow_unicode=True)
    capped = Settings.of(config).cap
    what = (
        "the cells the cap left in their panel (cut cells could still be the best: not a\n"
        "# confidence set)"
        if capped
        else "the cells of each panel the race never called slower than its best\n"
        "# (a 95 % confidence set of the best, unless the budget ended it)"
    )
    header = (
        f"# The winning set of trainscale tune of study {config['study']!r} ({csv}):\n"
        f"# {what}, as a study for a full benchmark:\n"
        f"# snakemake --configfile {Path(path).as_posix()}\n"
        + "".join(winner_line(c) for c in cells)
    )
    Path(path).write_text(header + text)


def winner_line(cell: CellDecision) -> str:
    """best.yaml's comment on a winner: its estimate and 95 % interval, and where they come
    from (its confirmation runs, or the runs that picked it: biased up)."""
    confirmed = "confirmation runs" in cell.reason and "biased up" not in cell.reason
    source = "from its confirmation runs" if confirmed else "selected: biased up"
    values = " ".join(f"{k}={cell.values[k]}" for k in ("strategy", "batch_size", "workers")
                      if k in cell.values)  # fmt: skip
    interval = f"{_fmt(cell.ci_low)} – {_fmt(cell.ci_high)}"
    estimate = f"{_fmt(cell.estimate)} {cell.unit}"
    return f"#   {cell.panel}: {values}: {estimate} (95 %: {interval}; {source})\n"


def _fmt(v: float | None) -> str:
    return "?" if v is None else f"{v:.4g}"


@dataclass(frozen=True)
class Costs:
    """What the tune spent, measured, beside what the study's whole grid would have cost,
    predicted (money: None where no device is priced)."""

    runs: int
    worker_hours: float
    money: float | None
    grid_runs: int
    grid_worker_hours: float
    grid_money: float | None
    currency: str
    unpredicted: list[str]  # cells without an ok tune run, left out of the grid's figures
    share: float  # the tune's worker-seconds over the grid's (NaN: no grid figure)


def costs(space: RoundZero, rounds: list[Round]) -> Costs:
    """What the tune spent (measured: its runs, worker-hours, and money where priced) beside
    what the study's whole grid would have cost (predicted from each cell's tune runs: its
    repeats × world_size × one run's predicted seconds); `unpredicted`: cells without an ok
    tune run, left out of the grid's figure."""
    last = last_decisions(rounds)
    spent = sum(r.worker_seconds for r in rounds)
    money = sum((c.worker_seconds or 0) * c.price / HOUR
                for r in rounds for c in r.cells if c.price is not None)  # fmt: skip
    repeats = space.grid.repeats
    grid, grid_money, unpredicted = 0.0, 0.0, []
    for c in last.values():
        if c.grid_seconds is None:
            unpredicted.append(c.cell)
            continue
        seconds = repeats * c.world_size * c.grid_seconds
        grid += seconds
        grid_money += seconds * c.price / HOUR if c.price is not None else 0.0
    priced = any(c.price is not None for c in last.values())
    return Costs(
        runs=sum(r.runs for r in rounds),
        worker_hours=spent / HOUR,
        money=money if priced else None,
        grid_runs=repeats * len(space.cells),
        grid_worker_hours=grid / HOUR,
        grid_money=grid_money if priced else None,
        currency=space.currency,
        unpredicted=unpredicted,
        share=spent / grid if grid > 0 else math.nan,
    )

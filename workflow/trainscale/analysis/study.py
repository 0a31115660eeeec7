"""A study's tables and their one way to and from disk: `Study.build` from metrics files,
`Study.write` into results/<study>, `Study.read` back, for the Snakemake scripts and for
`python -m trainscale.report` alike.

CSV keeps no types, so each table's column types are stated and applied both when a table is
built and when it is read: a table read back has the dtypes it was built with, and nothing
downstream re-types a column. The runs and epochs tables' types come from the metrics schema
(`trainscale.analysis.metrics_tables`); the other tables' are stated here, after their definitions
in `trainscale.analysis.cells` and `trainscale.analysis.comm_model`.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from trainscale.analysis import metrics_tables
from trainscale.analysis.cells import (
    CELL,
    METRICS,
    PROPORTIONAL,
    convergence_frame,
    scaling_frame,
)
from trainscale.analysis.comm_model import (
    COLLECTIVE_COLUMNS,
    COMM_COLUMNS,
    collectives_frame,
    communication_frame,
)
from trainscale.analysis.cost import FIGURES as COST_FIGURES
from trainscale.analysis.interval import CELL_COLUMNS, TEXT_COLUMNS
from trainscale.analysis.metrics_tables import (
    CELL_TYPES,
    EPOCH_TYPES,
    LEAD,
    epochs_frame,
    read_tables,
    runs_types,
)
from trainscale.analysis.ranking import FLAGS, VERDICTS, fastest, ranking, with_verdicts
from trainscale.analysis.settle import EQUIVALENCE
from trainscale.analysis.summary import summary_text
from trainscale.plan.prices import Prices

#: Table name -> its file in results/<study> (and the Snakemake input/output name it goes by).
FILES = {
    "runs": "runs.csv",
    "epochs": "epochs.csv",
    "scaling": "scaling.csv",
    "invalid": "invalid.csv",
    "collectives": "collectives.csv",
    "communication": "communication.csv",
}
#: The plain-text answers written beside the tables (`Study.write`, Snakemake output `summary`).
SUMMARY = "summary.txt"

_COMM_TEXT = ("exposed_method", "note")

#: Column types of the tables other than runs (columns not named are numbers as read).
TYPES: dict[str, dict[str, str]] = {
    "epochs": EPOCH_TYPES,
    "scaling": {
        **CELL_TYPES,
        "statuses": "str",
        "baseline_note": "str",
        "price_key": "str",
        "price_note": "str",
        "currency": "str",
        **dict.fromkeys(COST_FIGURES, "float64"),
        "efficiency_kind": "str",
        "single_best_strategy": "str",
        "oversubscribed": "bool",
        "logical": "bool",
        "global_batch_size": "float64",
        "per_worker_batch_size": "float64",
        "target_accuracy": "float64",
        **{f"{m}_{s}": "float64" for m in METRICS for s in ("mean", "std", "ci95")},
        **{f"{m}_ci95_repeats": "float64" for m in PROPORTIONAL if m in METRICS},
        **{c: "float64" for c in CELL_COLUMNS if c not in TEXT_COLUMNS},
        **dict.fromkeys(TEXT_COLUMNS, "str"),
        **{c: "bool" if c in FLAGS else "float64" for c in VERDICTS},
    },
    "invalid": {"path": "str", "error": "str"},
    "collectives": {
        "status": "str",
        "error": "str",
        "backend": "str",
        **dict.fromkeys(COLLECTIVE_COLUMNS[6:], "float64"),
    },
    "communication": {
        **CELL_TYPES,
        "world_size": "int64",
        **dict.fromkeys(("backend", *_COMM_TEXT), "str"),
        **{c: "float64" for c in COMM_COLUMNS[len(CELL) + 2 :] if c not in _COMM_TEXT},
    },
}
#: Text columns where an empty string is a value ("no note"), not a missing one.
FILLED = {
    "scaling": ("statuses", "baseline_note", "price_note", *TEXT_COLUMNS),
    "communication": ("note", "exposed_method"),
}


def _types(table: str, columns: Iterable[str]) -> dict[str, str]:
    columns = list(columns)
    types = runs_types(columns) if table == "runs" else TYPES[table]
    return {c: t for c, t in types.items() if c in columns}


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    """`df.to_csv(path, index=False)`, the same bytes, written through the csv module: pandas
    formats every value through an object array first, and the runs and epochs tables of
    100,000 runs took it 13 s (a third less this way). Column types it does not know (dates,
    categories) go to pandas."""
    columns = []
    for name in df.columns:
        s = df[name]
        if s.dtype == np.float64:
            a = s.to_numpy()
            values = a.tolist()
            if np.isnan(a).any():
                values = [None if v != v else v for v in values]  # NaN is written empty
        elif s.dtype.kind in "iub" and not s.hasnans:
            values = s.tolist()
        elif s.dtype.kind in "iubOT":  # strings, objects, nullable ints and booleans
            values = s.astype(object).where(s.notna(), None).tolist()
        else:
            df.to_csv(path, index=False)
            return
        columns.append(values)
    if not columns:
        df.to_csv(path, index=False)
        return
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(df.columns)
        out.writerows(zip(*columns, strict=True))


def invalid_table(invalid: list[tuple[str, str]]) -> pd.DataFrame:
    """invalid.csv's table: a row per unreadable metrics file, its path and why."""
    return pd.DataFrame(invalid, columns=["path", "error"])


def typed(table: str, df: pd.DataFrame) -> pd.DataFrame:
    """`df` with the stated dtypes of `table`'s columns (and "" for an empty note)."""
    df = metrics_tables.typed(df, _types(table, df.columns))
    fill = [c for c in FILLED.get(table, ()) if c in df and df[c].isna().any()]
    return df.fillna(dict.fromkeys(fill, "")) if fill else df


def _read_csv(table: str, path: str | Path) -> pd.DataFrame:
    if table == "invalid":  # an error message may be any text, "NA" included
        return pd.read_csv(path, dtype="str", keep_default_na=False)
    head = pd.read_csv(path, nrows=0).columns
    return typed(table, pd.read_csv(path, dtype=_types(table, head), low_memory=False))


def _empty(table: str) -> pd.DataFrame:
    columns = {
        "runs": LEAD,
        "epochs": epochs_frame([]).columns,
        "scaling": [*CELL, "world_size", "runs", "ok"],
        "invalid": ["path", "error"],
        "collectives": COLLECTIVE_COLUMNS,
        "communication": COMM_COLUMNS,
    }[table]
    return pd.DataFrame(columns=list(columns))


def _files(where: str | Path | Mapping) -> dict[str, object]:
    """{table or "summary": path} from a folder (its tables that exist) or from a mapping such
    as Snakemake's named input/output (its names that are tables; the rest is ignored)."""
    if hasattr(where, "items"):
        names = {*FILES, "summary"}
        return {k: v for k, v in where.items() if k in names}
    folder = Path(where)
    return {t: folder / f for t, f in FILES.items() if (folder / f).exists()}


@dataclass(frozen=True)
class Measured:
    """A study's tables of what was measured, before any cell is computed from them: runs,
    epochs, the invalid files and the all-reduce benchmark."""

    runs: pd.DataFrame
    epochs: pd.DataFrame
    invalid: list[tuple[str, str]]
    collectives: pd.DataFrame

    #: The tables `write` writes.
    NAMES = ("runs", "epochs", "invalid", "collectives")

    def write(self, folder: str | Path, names: Iterable[str] = NAMES) -> None:
        """The tables `names` (runs.csv, epochs.csv, invalid.csv and collectives.csv unless
        told) into `folder`, as `Study.write` writes them."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        for table in names:
            df = invalid_table(self.invalid) if table == "invalid" else getattr(self, table)
            write_csv(df, Path(folder) / FILES[table])


@dataclass
class Study:
    """A study's tables: runs (one row per run), epochs, scaling (one row per cell; computed
    from runs when not given), invalid files, and the all-reduce benchmark with the
    communication model when the study has one. From the study's config: `prices` (config
    `cost`: what scaling's cost_per_million prices at), `rank_by` (config `report.rank_by`:
    what the ranking orders by, throughput or cost) and `equivalence` (config
    `report.equivalence`: the margin of the equivalence test)."""

    name: str
    runs: pd.DataFrame
    epochs: pd.DataFrame = field(default_factory=lambda: _empty("epochs"))
    scaling: pd.DataFrame | None = None
    invalid: list[tuple[str, str]] = field(default_factory=list)
    collectives: pd.DataFrame = field(default_factory=lambda: _empty("collectives"))
    communication: pd.DataFrame = field(default_factory=lambda: _empty("communication"))
    prices: Prices | None = None
    rank_by: str = "throughput"
    equivalence: float = EQUIVALENCE

    def __post_init__(self) -> None:
        self.runs = typed("runs", self.runs)
        self.epochs = typed("epochs", self.epochs)
        if self.scaling is None:
            self.scaling = scaling_frame(self.runs, self.prices, self.equivalence)
        elif len(self.scaling) and "could_be_fastest" not in self.scaling:  # written before
            self.scaling = with_verdicts(self.scaling, self.equivalence)
        # consolidated: astype gives each cast column a block of its own, and the figures
        # that add columns to a frame of 100+ blocks make pandas warn of fragmentation
        self.scaling = typed("scaling", self.scaling).copy()
        self.collectives = typed("collectives", self.collectives)
        self.communication = typed("communication", self.communication)

    @classmethod
    def build(
        cls,
        metrics_paths: Iterable[str | Path],
        name: str | None = None,
        jobs: int = 1,
        default_name: str = "study",
        collectives: Iterable[str | Path] = (),
        config: Mapping | None = None,
        measured: Callable[[Measured], None] | None = None,
        while_reading: Callable[[], None] | None = None,
    ) -> Study:
        """Read and validate metrics files (by `jobs` processes) and compute every table; with
        the all-reduce benchmark's JSON files, its table and the communication model too; at
        the prices of `config` (the study's config: `options`). `measured` is given the tables
        of what was measured as soon as they are read, before the cells are computed;
        `while_reading` runs in this process while the reading processes work."""
        runs, epochs, invalid = read_tables(metrics_paths, jobs=jobs, meanwhile=while_reading)
        for p, why in invalid:
            print(f"trainscale: invalid metrics file {p}: {why}", file=sys.stderr)
        name = study_name(runs, default_name) if name is None else name
        runs, epochs = typed("runs", runs), typed("epochs", epochs)
        collectives = list(collectives)
        benchmark = typed("collectives", collectives_frame(collectives)) if collectives else None
        if measured is not None:
            none = _empty("collectives") if benchmark is None else benchmark
            measured(Measured(runs, epochs, invalid, none))
        study = cls(name, runs, epochs, **options(config))
        study.invalid = invalid
        if benchmark is not None:
            study._with_collectives(benchmark)
        return study

    def add_collectives(self, paths: Iterable[str | Path]) -> None:
        """collectives.csv from the benchmark's JSON files, and communication.csv from it."""
        paths = list(paths)
        if paths:
            self._with_collectives(typed("collectives", collectives_frame(paths)))

    def _with_collectives(self, table: pd.DataFrame) -> None:
        self.collectives = table
        self.communication = typed(
            "communication", communication_frame(self.scaling, self.runs, table)
        )

    @classmethod
    def read(
        cls, where: str | Path | Mapping, name: str | None = None, config: Mapping | None = None
    ) -> Study:
        """The tables the workflow wrote: every table file in the folder `where`, or the tables
        named in the mapping `where` (e.g. `snakemake.input`: runs, epochs, scaling, invalid,
        collectives, communication). runs is required; scaling is computed when absent, at
        the prices of `config` (the study's config: `options`)."""
        files = {k: v for k, v in _files(where).items() if k in FILES}
        if "runs" not in files:
            raise FileNotFoundError(f"{where}: no runs.csv (run the study first, or pass runs=)")
        tables = {t: _read_csv(t, p) for t, p in files.items()}
        invalid = tables.pop("invalid", None)
        runs = tables.pop("runs")
        study = cls(study_name(runs) if name is None else name, runs, **tables, **options(config))
        if invalid is not None:
            study.invalid = list(invalid[["path", "error"]].itertuples(index=False, name=None))
        return study

    def write(self, where: str | Path | Mapping, jobs: int = 1, skip: Iterable[str] = ()) -> None:
        """Every table and summary.txt into the folder `where`, or the ones named in the mapping
        `where` (e.g. `snakemake.output`) to the paths it gives; but the tables in `skip`
        (written already: `Measured.write`). With `jobs` > 1, epochs.csv (five or more rows
        per run: the longest to write) is written by a forked process while this one writes
        the rest."""
        if hasattr(where, "items"):
            files = _files(where)
        else:
            Path(where).mkdir(parents=True, exist_ok=True)
            files = {t: Path(where) / f for t, f in {**FILES, "summary": SUMMARY}.items()}
        files = {t: f for t, f in files.items() if t not in set(skip)}
        for path in files.values():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        beside = None
        if jobs > 1 and "epochs" in files and (ctx := metrics_tables.mp_context()) is not None:
            beside = ctx.Process(target=write_csv, args=(self.epochs, files.pop("epochs")))
            beside.start()
        try:
            for table, path in files.items():
                if table == "summary":
                    Path(path).write_text(self.summary())
                elif table == "invalid":
                    write_csv(invalid_table(self.invalid), path)
                else:
                    write_csv(getattr(self, table), path)
        finally:
            if beside is not None:
                beside.join()
        if beside is not None and beside.exitcode != 0:  # its traceback is on stderr
            raise RuntimeError(f"writing epochs.csv failed (exit status {beside.exitcode})")

    def summary(self) -> str:
        """summary.txt: the study's answers in plain text (trainscale.analysis.summary)."""
        return summary_text(
            self.runs, self.invalid, self.name, self.scaling, self.equivalence, self.by_throughput
        )

    @property
    def convergence(self) -> pd.DataFrame:
        if not hasattr(self, "_convergence"):
            self._convergence = convergence_frame(self.epochs)
        return self._convergence

    @property
    def fastest(self) -> pd.DataFrame:
        if not hasattr(self, "_fastest"):
            self._fastest = fastest(self.scaling, self.equivalence, self.by_throughput)
        return self._fastest

    @property
    def by_throughput(self) -> pd.DataFrame:
        """The ranking by throughput (what summary.txt's fastest and ties read, whatever
        `rank_by`), computed once: at 10,000 runs a ranking is half a second."""
        if not hasattr(self, "_by_throughput"):
            self._by_throughput = (
                ranking(self.scaling, "throughput", self.equivalence)
                if len(self.scaling)
                else self.scaling
            )
        return self._by_throughput

    @property
    def ranking(self) -> pd.DataFrame:
        """Per model, dataset and N every cell with an ok run, fastest first (analysis.ranking)."""
        if not hasattr(self, "_ranking"):
            self._ranking = (
                self.by_throughput
                if self.rank_by == "throughput" and len(self.scaling)
                else ranking(self.scaling, self.rank_by, self.equivalence)
            )
        return self._ranking


def options(config: Mapping | None) -> dict:
    """Study's fields from a study config: `prices` (config `cost`), `rank_by` and
    `equivalence` (config `report.rank_by`, `report.equivalence`)."""
    report = (config or {}).get("report") or {}
    return {
        "prices": Prices.from_config(config),
        "rank_by": report.get("rank_by") or "throughput",
        "equivalence": float(report.get("equivalence", EQUIVALENCE)),
    }


def study_name(runs: pd.DataFrame, default: str = "study") -> str:
    """The study's name from its runs (`spec.study`; several joined), else `default`."""
    names = runs["spec.study"].dropna().unique() if "spec.study" in runs else []
    return ", ".join(sorted(map(str, names))) or default

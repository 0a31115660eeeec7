"""The report's steps, one function each, shared by the two ways a report is made: the
Snakemake rules (one step per rule, in workflow/scripts/) and `python -m trainscale.report`
(`build`: every step in one process, figures drawn in a process pool while the tables and
predictions are written). Both call these functions, so the two paths cannot drift apart.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pandas as pd

from trainscale.analysis import metrics_tables, predict
from trainscale.analysis.study import Measured, Study
from trainscale.report import html as report

T = TypeVar("T")


def read(
    runs_dir: str | Path,
    name: str | None = None,
    jobs: int = 1,
    config: dict | None = None,
    measured: Callable[[Measured], None] | None = None,
    while_reading: Callable[[], None] | None = None,
) -> Study:
    """The study of the metrics files under `runs_dir`, with the all-reduce benchmark where it
    sits beside them (results/<study>/collectives), at the prices and ranking of `config`;
    `measured` is given the measured tables before the cells are computed, and
    `while_reading` runs here while the reading processes work (`Study.build`)."""
    paths = metrics_tables.metrics_paths(runs_dir)
    # unnamed runs in results/<study>/runs are named after <study>
    default = Path(runs_dir).resolve().parent.name if Path(runs_dir).name == "runs" else "study"
    found = sorted((Path(runs_dir).parent / "collectives").rglob("*.json"))
    return Study.build(
        paths, name, jobs, default_name=default, collectives=found, config=config,
        measured=measured, while_reading=while_reading,
    )  # fmt: skip


def figures(
    study: Study,
    out_dir: str | Path,
    config: dict | None,
    jobs: int = 1,
    meanwhile: Callable[[], None] | None = None,
    names: Sequence[str] | None = None,
) -> dict:
    """Every figure into out_dir (rule `figures`): PNG, and SVG with config `report.svg`;
    {name: trainscale.report.figures.Drawn}."""
    from trainscale.report.figures import render_all

    svg, highlight = report.options(config)
    return render_all(
        study, out_dir, names, jobs=jobs, svg=svg, highlight=highlight, meanwhile=meanwhile
    )


def wants_predictions(runs: pd.DataFrame, config: dict | None) -> bool:
    """Config `predict.enabled` (default true) and a multi-worker run (as common.smk's PREDICT)."""
    enabled = ((config or {}).get("predict") or {}).get("enabled", True)
    return bool(enabled and len(runs) and (runs["spec.world_size"] > 1).any())


def predictions(
    runs: pd.DataFrame,
    coll: pd.DataFrame | None,
    config: dict | None,
    csv: str | Path,
    check_csv: str | Path,
    figures_dir: str | Path,
) -> list[str]:
    """predictions.csv, prediction_check.csv and the predicted-scaling figure (rule
    `predictions`); the notes on what could not be predicted."""
    from trainscale.report import predict_plot

    predict_cfg = {"enabled": True, **((config or {}).get("predict") or {})}
    coll = pd.DataFrame() if coll is None else coll
    pred, check, notes = predict.predict_study(runs, coll, predict_cfg)
    pred.to_csv(csv, index=False)
    check.to_csv(check_csv, index=False)
    predict_plot.draw(pred, figures_dir, svg=report.options(config)[0])
    return notes


def build(
    runs_dir: str | Path,
    out: str | Path,
    name: str | None = None,
    config: dict | None = None,
    jobs: int = 1,
) -> Study:
    """Tables, figures, predictions and report.html in `out` from the metrics files under
    `runs_dir`: the rules' steps in one process (`python -m trainscale.report`), but for
    the tables of what was measured and the predictions from them, which two forked
    processes write while this one computes the cells (a core idle otherwise: the cells'
    statistics are one process's work)."""
    from trainscale.report import predict_plot

    out = Path(out)
    fig_dir = out / "figures"
    csv, check_csv = out / "predictions.csv", out / "prediction_check.csv"
    beside: list[Callable[[], dict | None]] = []

    def measured(tables: Measured) -> None:
        def work() -> dict:
            tables.write(out, names=("runs", "invalid", "collectives"))
            if not wants_predictions(tables.runs, config):
                return {}
            predictions(tables.runs, tables.collectives, config, csv, check_csv, fig_dir)
            return predict_plot.section(csv, check_csv, fig_dir / f"{predict_plot.NAME}.png")

        # epochs.csv (five or more rows a run) in a process of its own: written with the
        # runs' table, it ran on alone for 3.5 s after the figures at 100,000 runs
        def epochs() -> None:
            tables.write(out, names=("epochs",))

        beside.extend((forked(work), forked(epochs)))

    def plotting() -> None:
        # matplotlib's import (half a second) here, while the reading processes work: the
        # processes forked after it (the predictions' writer, the figures' pool) inherit it
        # instead of each importing it again
        import trainscale.report.figures  # noqa: F401

    study = read(runs_dir, name=name, jobs=jobs, config=config, measured=measured,
                 while_reading=plotting)  # fmt: skip
    tables: dict = {}

    def meanwhile() -> None:  # in this process while the pool draws the figures
        study.write(out, jobs=jobs, skip=Measured.NAMES)
        tables.update(report.tables_context(study, config))

    drawn = figures(study, fig_dir, config, jobs=jobs, meanwhile=meanwhile)
    written = [wait() for wait in beside]  # both writers done, or the first error raised
    predicted = written[0] if written else {}
    report.write_html(
        study,
        out / "report.html",
        fig_dir,
        config=config,
        drawn=drawn,
        predicted=predicted or None,
        tables=tables or None,
    )
    return study


def forked(work: Callable[[], T]) -> Callable[[], T]:
    """Start `work` in a forked process; the function returned waits for it and gives its
    result (pickled back), raising where it failed. Without fork (not Linux), `work` runs
    here when its result is asked for."""
    ctx = metrics_tables.mp_context()
    if ctx is None:
        return work
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send((True, work()))
        except BaseException:  # its traceback, for the parent's error
            send.send((False, traceback.format_exc()))

    process = ctx.Process(target=child, daemon=True)
    process.start()
    send.close()

    def result() -> T:
        try:
            ok, value = receive.recv()
        except EOFError:  # died without a word (killed, out of memory)
            ok, value = False, f"exit status {process.exitcode}"
        finally:
            process.join()
        if not ok:
            raise RuntimeError(f"a forked part of the report failed:\n{value}")
        return value

    return result

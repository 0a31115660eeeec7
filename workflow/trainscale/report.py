"""The study report: one self-contained HTML file (figures embedded) from a study's tables.

Also a command line to make the whole report from metrics files alone, e.g. files copied back
from a cluster, without Snakemake and without re-running any training:

    python -m trainscale.report --runs-dir results/<study>/runs --out results/<study>

Every file is validated against the metrics schema; files that fail are listed in the report and
in summary.txt, never counted, and never stop the rest.
"""

from __future__ import annotations

import argparse
import base64
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pandas as pd
import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

import trainscale
from trainscale import aggregate, catalog, collectives, metrics, predict
from trainscale.aggregate import Study, human

REPORTS = Path(__file__).resolve().parents[2] / "reports"
TEMPLATE = "report.html.j2"


# --------------------------------------------------------------------------------------------
# numbers for people


def _na(v) -> bool:
    return v is None or (not isinstance(v, str) and pd.isna(v))


def with_ci(mean, ci, unit: str = "") -> str:
    """`12,700 ± 340 samples/s`: 3 significant digits, the 95% CI half-width when there is one."""
    if _na(mean):
        return "–"
    s = human(mean)
    if not _na(ci):
        s += f" ± {human(ci)}"
    return f"{s} {unit}".rstrip()


def mib(v, ci=None) -> str:
    if _na(v):
        return "–"
    if v >= 2**30:
        return with_ci(v / 2**30, None if _na(ci) else ci / 2**30, "GiB")
    return with_ci(v / 2**20, None if _na(ci) else ci / 2**20, "MiB")


def pct(v) -> str:
    return "–" if _na(v) else f"{human(100 * v)} %"


def ratio(v) -> str:
    return "–" if _na(v) else f"{human(v)}×"


# --------------------------------------------------------------------------------------------
# Methods: the definitions, taken from the modules' docstrings (the single source)


def definitions(doc: str) -> tuple[str, list[tuple[str, list[tuple[str, bool]]]]]:
    """(intro, [(term, text)]) from a docstring whose bullets read `- term: text`; the term ends
    at the first colon outside parentheses, and text is [(segment, is_code)] split at backticks.
    """
    intro, items, current = [], [], None
    for line in textwrap.dedent(doc).splitlines():
        if line.startswith("- "):
            split = _term_end(line)
            if split is None:  # a bullet without a term
                current = ["", line[2:].strip()]
            else:
                current = [line[2:split].strip(), line[split + 1 :].strip()]
            items.append(current)
        elif current is not None and line.startswith("  ") and line.strip():
            current[1] += " " + line.strip()
        elif line.strip():
            current = None
            if not items:
                intro.append(line.strip())
    return " ".join(intro), [(term, _code_segments(text)) for term, text in items]


def _term_end(line: str) -> int | None:
    depth = 0
    for i, ch in enumerate(line):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == ":" and depth == 0:
            return i
    return None


def _code_segments(text: str) -> list[tuple[str, bool]]:
    """`a `b` c` -> [("a ", False), ("b", True), (" c", False)]."""
    return [(seg, i % 2 == 1) for i, seg in enumerate(text.split("`")) if seg]


def _caption(name: str) -> str:
    p = REPORTS / "figures" / f"{name}.rst"
    return " ".join(p.read_text().split()) if p.exists() else ""


# --------------------------------------------------------------------------------------------
# context


def _cell_label(r) -> str:
    mode = "per-worker" if r.batch_mode == "per_worker" else "global"
    return f"batch {r.batch_size} {mode}, scale {r.scale}, {r.precision}"


def cell_note(r) -> str:
    """A table row's note: why its baseline is what it is, and what its strategy's results
    need beside them (the catalog's `results_note`: tf-ps is asynchronous)."""
    notes = [r.baseline_note if isinstance(r.baseline_note, str) else ""]
    row = catalog.STRATEGIES.get(r.strategy)
    notes.append(row.results_note if row else "")
    return "; ".join(n for n in notes if n)


def _summary_rows(study: Study) -> list[dict]:
    rows = []
    for r in study.fastest.itertuples(index=False):
        runner = "no other strategy ran at this N"
        if isinstance(r.runner_up, str):
            runner = (
                f"{r.runner_up} ({human(r.runner_up_throughput)} samples/s): {pct(r.margin)} ahead"
            )
            if r.distinct is False:
                runner += ", 95% CIs overlap"
            elif r.distinct is True:
                runner += ", CIs disjoint"
        eff = f"{pct(r.efficiency)} {r.efficiency_kind}" if not _na(r.efficiency) else "–"
        rows.append(
            {
                "model": r.model,
                "dataset": r.dataset,
                "n": int(r.world_size),
                "strategy": r.strategy,
                "config": _cell_label(r) + (f", {r.nodes} nodes" if r.nodes != 1 else ""),
                "throughput": with_ci(r.throughput_mean, r.throughput_ci95, "samples/s"),
                "speedup": ratio(r.speedup),
                "efficiency": eff,
                "vs_single": ratio(r.speedup_vs_single),
                "note": cell_note(r),
                "runner_up": runner,
                "oversubscribed": bool(r.oversubscribed),
                "logical": bool(getattr(r, "logical", False)),
                "runs": f"{r.ok}/{r.runs}",
            }
        )
    return rows


def _scaling_rows(study: Study) -> list[dict]:
    s = study.scaling
    if not len(s):
        return []
    s = s.sort_values(
        [
            "model",
            "dataset",
            "scale",
            "batch_size",
            "batch_mode",
            "precision",
            "strategy",
            "nodes",
            "world_size",
        ],
        kind="stable",
    )
    rows = []
    for r in s.itertuples(index=False):
        tta = "–"
        if not _na(r.time_to_accuracy_seconds_mean) or not _na(r.target_accuracy):
            reached = int(r.time_to_accuracy_seconds_n)
            tta = (
                with_ci(r.time_to_accuracy_seconds_mean, r.time_to_accuracy_seconds_ci95, "s")
                + f" ({reached}/{r.ok} reached)"
            )
        eff = "–" if _na(r.efficiency) else f"{pct(r.efficiency)} {r.efficiency_kind}"
        rows.append(
            {
                "strategy": r.strategy,
                "model": r.model,
                "dataset": r.dataset,
                "scale": r.scale,
                "batch": f"{r.batch_size} {r.batch_mode.replace('_', '-')}",
                "n": f"{r.world_size}" + (f" ({r.workers}×{r.nodes})" if r.nodes > 1 else ""),
                "precision": r.precision,
                "runs": f"{r.ok}/{r.runs}",
                "statuses": r.statuses,
                "throughput": with_ci(r.throughput_mean, r.throughput_ci95),
                "per_worker": with_ci(r.throughput_per_worker_mean, None),
                "epoch1": with_ci(r.first_epoch_seconds_mean, r.first_epoch_seconds_ci95),
                "steady": with_ci(r.steady_epoch_seconds_mean, r.steady_epoch_seconds_ci95),
                "overhead": with_ci(
                    r.first_epoch_overhead_seconds_mean, r.first_epoch_overhead_seconds_ci95
                ),
                "speedup": ratio(r.speedup),
                "efficiency": eff,
                "vs_single": ratio(r.speedup_vs_single)
                + (
                    f" ({r.single_best_strategy})"
                    if isinstance(r.single_best_strategy, str) and not _na(r.speedup_vs_single)
                    else ""
                ),
                "accuracy": with_ci(r.test_accuracy_mean, r.test_accuracy_ci95),
                "tta": tta,
                "rss": mib(r.peak_host_rss_bytes_mean, r.peak_host_rss_bytes_ci95),
                "device": mib(r.peak_device_bytes_mean, r.peak_device_bytes_ci95),
                "note": cell_note(r),
                "oversubscribed": bool(r.oversubscribed),
                "logical": bool(getattr(r, "logical", False)),
                "failed": int(r.failed) > 0,
            }
        )
    return rows


def _seconds(v) -> str:
    if _na(v):
        return "–"
    return f"{human(v * 1e3)} ms" if v < 1 else f"{human(v)} s"


def _n_measured_collectives(study: Study) -> int:
    c = study.collectives
    return 0 if c is None else len(aggregate.measured_collectives(c))


def _failed_collective_rows(study: Study) -> list[dict]:
    """All-reduce benchmarks that could not run, with why (recorded, never silently absent)."""
    c = study.collectives
    if c is None:
        return []
    return [
        {
            "backend": r.backend,
            "shape": f"{r.workers} workers × {r.nodes} node(s)",
            "first": str(r.error).splitlines()[0],
            "error": str(r.error),
        }
        for r in aggregate.failed_collectives(c).itertuples(index=False)
    ]


def _communication_rows(study: Study) -> list[dict]:
    c = study.communication
    if c is None or not len(c):
        return []
    rows = []
    for r in c.sort_values(["model", "dataset", "strategy", "world_size"]).itertuples(index=False):
        rows.append(
            {
                "strategy": r.strategy,
                "model": r.model,
                "dataset": r.dataset,
                "batch": f"{r.batch_size} {r.batch_mode.replace('_', '-')}",
                "n": f"{r.world_size}" + (f" ({r.workers}×{r.nodes})" if r.nodes > 1 else ""),
                "precision": r.precision,
                "backend": r.backend,
                "gradient": mib(r.gradient_bytes),
                "volume": f"{r.allreduce_volume:g}",
                "busbw": "–"
                if _na(r.busbw_bytes_per_second)
                else f"{human(r.busbw_bytes_per_second / 1e9)} GB/s",
                "predicted": _seconds(r.predicted_comm_seconds),
                "measured": _seconds(r.measured_step_seconds),
                "share": pct(r.comm_share),
                "efficiency": pct(r.efficiency),
                "bound": pct(r.network_bound_efficiency),
                "compute": _seconds(getattr(r, "measured_compute_seconds", None)),
                "exposed": _seconds(getattr(r, "measured_exposed_seconds", None)),
                "exposed_share": pct(getattr(r, "exposed_share", None)),
                "exposed_method": str(getattr(r, "exposed_method", "") or ""),
                "note": r.note if isinstance(r.note, str) else "",
            }
        )
    return rows


def _failed_rows(study: Study) -> list[dict]:
    runs = study.runs
    if not len(runs):
        return []
    failed = runs[runs["status"] != "ok"].sort_values("run")
    rows = []
    for _, r in failed.iterrows():
        err = r["error"] if isinstance(r["error"], str) else ""
        lines = err.strip().splitlines()
        rows.append(
            {
                "run": r["run"],
                "status": r["status"],
                "first": lines[0] if lines else "",
                "error": err.strip(),
                "oversubscribed": bool(r.get("oversubscribed")),
            }
        )
    return rows


def _values(series: pd.Series, split: bool = False) -> str:
    """`a (3 runs); b (1 run)`: the distinct values of a column with their run counts."""
    vals = series.dropna().astype(str)
    if split:
        vals = pd.Series([v for s in vals for v in s.split()])
    c = Counter(vals)
    if not c:
        return "–"
    if len(c) == 1:
        return next(iter(c))
    return "; ".join(f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in sorted(c.items()))


def _environment(study: Study) -> list[tuple[str, str]]:
    r = study.runs
    if not len(r):
        return []
    out = [("hosts", _values(r.get("env.hostnames", pd.Series(dtype=object)), split=True))]
    dev = r.get("device.kind", pd.Series(dtype=object)).fillna("?").astype(str)
    name = r.get("device.name", pd.Series(dtype=object)).fillna("?").astype(str)
    count = r.get("device.count", pd.Series(dtype=object))
    count = count.map(lambda v: "?" if _na(v) else str(int(v)))
    ok = r["status"] == "ok"
    devices = dev + " · " + name + " · " + count + " per run"
    out.append(("devices (ok runs)", _values(devices[ok])))
    for label, col in (
        ("CPUs per node", "env.cpu_count"),
        ("python", "env.python"),
        ("trainscale", "env.trainscale"),
        ("CUDA", "env.cuda"),
        ("driver", "env.driver"),
    ):
        if col in r and r[col].notna().any():
            v = r[col]
            if col == "env.cpu_count":
                v = v.dropna().astype(int)
            out.append((label, _values(v)))
    for col in sorted(c for c in r.columns if c.startswith("env.frameworks.")):
        out.append((col.removeprefix("env.frameworks."), _values(r[col])))
    if "env.slurm_job_id" in r and r["env.slurm_job_id"].notna().any():
        out.append(("SLURM jobs", str(r["env.slurm_job_id"].nunique())))
    if "launch.mode" in r:
        out.append(("launch mode", _values(r["launch.mode"])))
    if "env.start_utc" in r:
        out.append(("runs between", f"{r['env.start_utc'].min()} and {r['env.end_utc'].max()}"))
    return out


def _spec_values(study: Study) -> str:
    """The study config as the runs' specs show it (when no config file is given)."""
    r = study.runs
    cols = sorted(c for c in r.columns if c.startswith("spec."))
    seen = {}
    for c in cols:
        vals = sorted({str(v) for v in r[c].dropna()})
        seen[c.removeprefix("spec.")] = vals[0] if len(vals) == 1 else vals
    return yaml.safe_dump(seen, sort_keys=True, allow_unicode=True)


def _figure_entries(figures_dir: Path | None, notes: dict[str, str | None]) -> list[dict]:
    from trainscale.plots import FIGURES

    out = []
    for name, info in FIGURES.items():
        entry = {
            "name": name,
            "title": info["title"],
            "category": info["category"],
            "caption": _caption(name),
            "note": notes.get(name),
            "src": None,
        }
        png = figures_dir / f"{name}.png" if figures_dir else None
        if entry["note"] is None:
            if png is None or not png.exists():
                entry["note"] = f"figure file {name}.png is missing"
            else:
                entry["src"] = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode(
                    "ascii"
                )
        out.append(entry)
    return out


def context(
    study: Study,
    figures_dir: str | Path | None,
    notes: dict[str, str | None],
    config: dict | None = None,
    compared: dict | None = None,
    predicted: dict | None = None,
) -> dict:
    """Everything the template shows, already formatted; `compared` is the "Compared with …"
    section (trainscale.compare_output.section), None when the study sets no compare_with;
    `predicted` is the "Predicted scaling" section (trainscale.predict_plot.section), None when
    predictions are off."""
    runs = study.runs
    counts = runs["status"].value_counts().to_dict() if len(runs) else {}
    over = int(runs["oversubscribed"].astype(bool).sum()) if len(runs) else 0
    run_intro, run_defs = definitions(metrics.__doc__ or "")
    cell_intro, cell_defs = definitions(aggregate.__doc__ or "")
    coll_intro, coll_defs = definitions(collectives.__doc__ or "")
    pred_intro, pred_defs = definitions(predict.__doc__ or "")
    run_intro, cell_intro = _code_segments(run_intro), _code_segments(cell_intro)
    figures = _figure_entries(Path(figures_dir) if figures_dir else None, notes)
    scaling = _scaling_rows(study)
    return {
        "study": study.name,
        "version": trainscale.__version__,
        "n_runs": len(runs),
        "n_cells": len(study.scaling),
        "statuses": sorted(counts.items()),
        "n_invalid": len(study.invalid),
        "n_oversubscribed": over,
        "summary": _summary_rows(study),
        "missing": sorted({r["note"] for r in scaling if r["note"]}),
        "figures": figures,
        "scaling": scaling,
        "communication": _communication_rows(study),
        "predicted": predicted,
        "n_collectives": _n_measured_collectives(study),
        "failed_collectives": _failed_collective_rows(study),
        "failed": _failed_rows(study),
        "invalid": study.invalid,
        "environment": _environment(study),
        "config": yaml.safe_dump(config, sort_keys=False, allow_unicode=True) if config else None,
        "compared": compared,
        "spec_values": _spec_values(study) if len(runs) else "",
        "methods": {
            "run_intro": run_intro,
            "runs": run_defs,
            "cell_intro": cell_intro,
            "cells": cell_defs,
            "coll_intro": _code_segments(coll_intro),
            "coll": coll_defs,
            "pred_intro": _code_segments(pred_intro),
            "pred": pred_defs,
        },
    }


def templates() -> Environment:
    """The jinja2 environment of every page trainscale writes (reports/*.j2): autoescaped,
    strict about missing values."""
    return Environment(
        loader=FileSystemLoader(REPORTS),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_html(ctx: dict) -> str:
    return templates().get_template(TEMPLATE).render(**ctx)


def write_html(
    study: Study,
    out: str | Path,
    figures_dir: str | Path | None,
    config: dict | None = None,
    notes: dict[str, str | None] | None = None,
    compared: dict | None = None,
    predicted: dict | None = None,
) -> Path:
    """report.html for `study`, embedding figures_dir/<name>.png; `notes` (why a figure has no
    data) are recomputed from the tables when not given."""
    if notes is None:
        from trainscale import plots

        notes = {name: plots.why_absent(name, study) for name in plots.FIGURES}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = context(study, figures_dir, notes, config, compared=compared, predicted=predicted)
    out.write_text(render_html(ctx), encoding="utf-8")
    return out


# --------------------------------------------------------------------------------------------
# command line


def build(
    runs_dir: str | Path,
    out: str | Path,
    name: str | None = None,
    config: dict | None = None,
    jobs: int = 1,
) -> Study:
    """Tables, figures and report.html in `out` from the metrics files under `runs_dir`."""
    from trainscale import plots

    paths = aggregate.find_metrics(runs_dir)
    # unnamed runs in results/<study>/runs are named after <study>
    default = Path(runs_dir).resolve().parent.name if Path(runs_dir).name == "runs" else "study"
    # the all-reduce benchmark, where it sits beside the runs (results/<study>/collectives)
    found = sorted((Path(runs_dir).parent / "collectives").rglob("*.json"))
    study = Study.build(paths, name, jobs, default_name=default, collectives=found)
    out = Path(out)
    notes = plots.render_all(study, out / "figures", jobs=jobs, meanwhile=lambda: study.write(out))
    predicted = None
    predict_cfg = {"enabled": True, **((config or {}).get("predict") or {})}
    if predict_cfg["enabled"] and len(study.runs) and (study.runs["spec.world_size"] > 1).any():
        from trainscale import predict_plot

        pred, check, _ = predict.predict_study(study.runs, study.collectives, predict_cfg)
        pred.to_csv(out / "predictions.csv", index=False)
        check.to_csv(out / "prediction_check.csv", index=False)
        png = predict_plot.draw(pred, out / "figures")[0]
        predicted = predict_plot.section(out / "predictions.csv", out / "prediction_check.csv", png)
    write_html(
        study, out / "report.html", out / "figures", config=config, notes=notes, predicted=predicted
    )
    return study


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainscale.report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent(
            """\
            Make a study's tables, figures and HTML report from its metrics files alone
            (e.g. results/<study>/runs copied back from a cluster); nothing is re-run.

            Every **/metrics.json under --runs-dir is validated against the metrics schema
            (workflow/schemas/metrics.schema.yaml); files that fail are listed in
            summary.txt, invalid.csv and the report, and not counted.

            Writes into --out:
              runs.csv      one row per run (failed runs included, with status and error)
              epochs.csv    one row per run and epoch
              scaling.csv   one row per cell: mean/std/95% CI over repeats, speedup, efficiency
              invalid.csv   metrics files that failed validation, and why
              summary.txt   fastest strategy per model and worker count, and its efficiency
              predictions.csv, prediction_check.csv   predicted scaling (config `predict`)
              figures/      <figure>.svg and .png
              report.html   one self-contained file (figures embedded) to open or mail
            """
        ),
        epilog="Exit status: 0 when the report was written (1 with --strict and invalid "
        "files), 2 when --runs-dir holds no metrics.json at all.",
    )
    p.add_argument(
        "--runs-dir",
        required=True,
        type=Path,
        help="directory searched recursively for metrics.json files",
    )
    p.add_argument("--out", required=True, type=Path, help="directory to write into")
    p.add_argument("--study", help="study name for titles (default: spec.study of the runs)")
    p.add_argument(
        "--config",
        type=Path,
        help="the study's config YAML, shown in the report (default: the values "
        "seen in the runs' specs)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=aggregate.default_jobs(),
        help="processes for reading files and drawing figures (default: %(default)s)",
    )
    p.add_argument(
        "--strict", action="store_true", help="exit with status 1 when any metrics file is invalid"
    )
    a = p.parse_args(argv)
    if not any(aggregate.find_metrics(a.runs_dir)[:1]):
        print(f"trainscale.report: no metrics.json under {a.runs_dir}", file=sys.stderr)
        return 2
    config = yaml.safe_load(a.config.read_text()) if a.config else None
    study = build(a.runs_dir, a.out, name=a.study, config=config, jobs=max(1, a.jobs))
    print(
        f"trainscale.report: {len(study.runs)} runs, {len(study.scaling)} cells, "
        f"{len(study.invalid)} invalid files -> {a.out / 'report.html'}",
        file=sys.stderr,
    )
    return 1 if a.strict and study.invalid else 0


if __name__ == "__main__":
    sys.exit(main())

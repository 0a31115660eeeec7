"""summary.txt: the study's answers in plain text (the fastest strategy per model and N with its
efficiency, the cells that could be the fastest at 95 % and what each panel resolves, every
cell's mean ± 95% CI, what failed, which measurements after training failed, or was invalid),
and `human`, the number format every table, card and page shares."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from trainscale.analysis import cost
from trainscale.analysis.cells import scaling_frame
from trainscale.analysis.flags import LOGICAL, cell_flags
from trainscale.analysis.interval import REPEATS
from trainscale.analysis.ranking import fastest, ranking
from trainscale.analysis.repeats import panel_lines
from trainscale.analysis.settle import EQUIVALENCE, METHOD, resolves
from trainscale.plan import catalog

#: The strategy column of the summary table: as wide as the longest strategy name, plus a space.
W = 1 + max(map(len, catalog.STRATEGIES))


def human(v: float | None, unit: str = "", digits: int = 3) -> str:
    """A number for people: `digits` significant digits, thousands separators, a unit."""
    if v is None or pd.isna(v):
        return "n/a"
    v = float(v)
    if v == 0:
        s = "0"
    else:
        mag = math.floor(math.log10(abs(v)))
        r = round(v, digits - 1 - mag)
        if abs(r) >= 10 ** (digits - 1):
            s = f"{r:,.0f}"
        else:
            s = f"{r:.{max(digits - 1 - math.floor(math.log10(abs(r))), 0)}f}"
    return f"{s} {unit}".rstrip() if unit else s


def summary_text(
    df: pd.DataFrame,
    invalid: list[tuple[str, str]],
    study: str,
    scaling: pd.DataFrame | None = None,
    equivalence: float = EQUIVALENCE,
    ranked: pd.DataFrame | None = None,
) -> str:
    """Plain-text answers: fastest strategy per model and N with its efficiency, the cells
    that could be the fastest and what each panel resolves, every cell's mean ± 95% CI, and
    what failed or was invalid. `ranked`: the ranking by throughput of `scaling`, where the
    caller has it (`Study.by_throughput`), else computed here once."""
    scaling = scaling_frame(df, equivalence=equivalence) if scaling is None else scaling
    if ranked is None and len(scaling):
        ranked = ranking(scaling, equivalence=equivalence)
    fast = fastest(scaling, equivalence, ranked)
    ok = scaling[scaling["ok"] > 0] if len(scaling) else scaling
    lines = [headline(df, study, scaling)]
    lines += fastest_lines(fast, scaling)
    lines += ties(scaling, equivalence, ranked)
    lines += cost_lines(scaling)
    lines += logical_lines(scaling if len(fast) else fast)
    lines += table_lines(ok)
    lines += baseline_lines(ok)
    lines += results_notes(df)
    lines += failure_lines(df, invalid)
    return "\n".join(lines) + "\n"


def headline(df: pd.DataFrame, study: str, scaling: pd.DataFrame) -> str:
    """The study, its runs and cells, and its runs by status."""
    line = f"trainscale study {study!r}: {len(df)} runs in {len(scaling)} cells"
    if len(df):
        counts = df["status"].value_counts().to_dict()
        line += " (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")"
    return line


def fastest_lines(fast: pd.DataFrame, scaling: pd.DataFrame) -> list[str]:
    """The fastest strategy of each model, dataset and N, with what could be the fastest."""
    if not len(fast):
        return []
    lines = ["", "fastest strategy per model, dataset and N (geometric mean of repeats ± 95% CI):"]
    taken = panel_lines(scaling)  # a study with repeats {min, max}
    for r in fast.itertuples(index=False):
        lines.append(fastest_line(r))
        if isinstance(r.runner_up, str):
            lines.append(f"    at 95 %, the fastest is one of {{{r.could_be}}}; "
                         f"{resolves(r.mdd_rel, r.repeats_for_5pct)}")  # fmt: skip
        if line := taken.get((r.model, r.dataset, r.world_size)):
            lines.append(f"    repeats taken: {line}")
    return lines


def fastest_line(r: Any) -> str:
    """A row of `ranking.fastest` (`itertuples`) as summary.txt says it."""
    eff = (
        f"{r.efficiency_kind} efficiency {human(100 * r.efficiency)} %"
        if pd.notna(r.efficiency)
        else f"efficiency n/a: {r.baseline_note}"
    )
    ci = f" ± {human(r.rate_gci95)}" if pd.notna(r.rate_gci95) else ""
    ahead = ""
    if isinstance(r.runner_up, str):
        ahead = f"; {human(100 * r.margin)} % ahead of {r.runner_up}"
        ahead += " (slower)" if r.distinct else " (could be the fastest)"
    mfu_mean = getattr(r, "mfu_mean", None)
    mfu = f", MFU {human(100 * mfu_mean)} %" if pd.notna(mfu_mean) else ""
    flag = "".join(f" [{f.note}]" for f in cell_flags(r))
    return (
        f"  {r.model} on {r.dataset}, N={r.world_size}: {r.strategy} "
        f"(batch {r.batch_size} {r.batch_mode}, scale {r.scale}, {r.precision}) "
        f"{human(r.rate_gmean)}{ci} {r.unit}, {eff}{mfu}{ahead}{flag}"
    )


def logical_lines(scaling: pd.DataFrame) -> list[str]:
    """The cells on logical CPU devices, never ranked, with their throughput."""
    logical = scaling[(scaling["ok"] > 0) & scaling["logical"].astype(bool)] if len(scaling) else []
    if not len(logical):
        return []
    return ["", f"not ranked ({LOGICAL.note}):"] + [
        f"  {r.strategy} {r.model} on {r.dataset}, N={r.world_size}, batch {r.batch_size} "
        f"{r.batch_mode}: {human(r.throughput_mean)} samples/s"
        for r in logical.itertuples(index=False)
    ]


def table_lines(ok: pd.DataFrame) -> list[str]:
    """Every cell with an ok run, a line each (report/endnote.py finds its header)."""
    if not len(ok):
        return []
    lines = [
        "",
        f"{'strategy':<{W}}{'model':<14}{'dataset':<19}{'scale':>5}{'N':>4}{'batch':>7} "
        f"{'mode':<11}{'ok':>5}{'samples/s':>11}{'± CI':>9}{'epoch1 s':>10}{'steady s':>10}"
        f"{'speedup':>9}{'eff %':>7}{'test acc':>9}{'RSS MiB':>9}",
    ]
    for r in ok.itertuples(index=False):
        flag = "".join(f"  {f.label}" for f in cell_flags(r))
        flag += "  CI: repeats only" if getattr(r, "interval_method", "") == REPEATS else ""
        eff = human(100 * r.efficiency) if pd.notna(r.efficiency) else "n/a"
        lines.append(
            f"{r.strategy:<{W}}{r.model:<14}{r.dataset:<19}{r.scale:>5}{r.world_size:>4}"
            f"{r.batch_size:>7} {r.batch_mode:<11}{f'{r.ok}/{r.runs}':>5}"
            f"{human(r.throughput_mean):>11}{human(r.throughput_ci95):>9}"
            f"{human(r.first_epoch_seconds_mean):>10}{human(r.steady_epoch_seconds_mean):>10}"
            f"{human(r.speedup):>9}{eff:>7}{human(r.test_accuracy_mean):>9}"
            f"{human(r.peak_host_rss_bytes_mean / 2**20):>9}{flag}"
        )
    return lines


def baseline_lines(ok: pd.DataFrame) -> list[str]:
    """The cells with an ok run but no speedup or efficiency, with why."""
    notes = ok[ok["baseline_note"] != ""] if len(ok) else ok
    if not len(notes):
        return []
    return ["", "no speedup/efficiency for:"] + [
        f"  {r.strategy} {r.model} {r.dataset} N={r.world_size} batch "
        f"{r.batch_size} {r.batch_mode}: {r.baseline_note}"
        for r in notes.itertuples(index=False)
    ]


def results_notes(df: pd.DataFrame) -> list[str]:
    """What the strategies that ran need read beside their numbers (the catalog's notes)."""
    ran = sorted(set(df["spec.strategy"])) if len(df) and "spec.strategy" in df else []
    said = [(n, catalog.STRATEGIES[n].results_note) for n in ran if n in catalog.STRATEGIES]
    if not any(note for _, note in said):  # e.g. tf-ps: asynchronous, not comparable step by step
        return []
    return ["", "read beside the numbers:"] + [f"  {n}: {note}" for n, note in said if note]


def failure_lines(df: pd.DataFrame, invalid: list[tuple[str, str]]) -> list[str]:
    """The failed runs with their first line of error, the failed parts of runs that
    trained, and the invalid metrics files."""
    lines = []
    failed = df[df["status"] != "ok"] if len(df) else df
    if len(failed):
        lines += ["", "failed runs:"]
        first = failed["error"].astype(object).where(failed["error"].notna(), "")
        first = first.astype(str).str.strip().str.split("\n", n=1).str[0]
        lines += list("  [" + failed["status"] + "] " + failed["run"] + ": " + first)
    parts = failed_parts(df)
    if parts:
        lines += ["", "failed parts of runs that trained (their figures null, the rest kept):"]
        lines += [f"  {run}: {part}: {error}" for run, part, error in parts]
    if invalid:
        lines += ["", "invalid metrics files (not counted):"]
        lines.extend(f"  {p}: {why}" for p, why in invalid)
    return lines


def ties(
    scaling: pd.DataFrame, equivalence: float = EQUIVALENCE, ranked: pd.DataFrame | None = None
) -> list[str]:
    """The lines naming every cell that could be its panel's fastest but is not it, and what
    the panel resolves (or that it is equivalent to the fastest, or has one run and no
    interval: trainscale.analysis.settle), and what the CIs are; none without a ranking.
    `ranked`: the ranking by throughput of `scaling` where the caller has it."""
    r = ranked
    if r is None:
        r = ranking(scaling, equivalence=equivalence) if len(scaling) else scaling
    if not len(r) or "could_be_fastest" not in r:
        return []
    lines = ["", "± CI: 95% from steps and repeats (Methods: confidence interval); "
             "'CI: repeats only' marks cells whose records lack step times", METHOD]  # fmt: skip
    lines += prior_line(scaling)
    tied = r[r["could_be_fastest"] & ~r["fastest"]]
    if not len(tied):
        return lines
    best = r[r["fastest"]].set_index(["model", "dataset", "world_size"])["strategy"]
    lines += ["", "could be the fastest at 95 % (all cells of a panel compared at once; "
              "Methods: comparison with the best):"]  # fmt: skip
    for t in tied.itertuples(index=False):
        first = best.get((t.model, t.dataset, t.world_size), "?")
        lines.append(
            f"  {t.model} on {t.dataset}, N={t.world_size}: {t.strategy} "
            f"{human(100 * t.behind)} % behind {first}: {t.settle}"
        )
    return lines


def prior_line(scaling: pd.DataFrame) -> list[str]:
    """The study's fitted prior of the run-to-run variances (Methods: confidence interval)."""
    cols = ["prior_df", "prior_scale"]
    fitted = scaling[cols].dropna() if all(c in scaling for c in cols) else scaling[[]]
    if not len(fitted):
        return []
    d0, s0 = (float(fitted[c].iloc[0]) for c in cols)
    text = f"d0 = {human(d0)} (capped at 3), s0 = {human(s0)} (sd of log throughput a run)"
    return [f"run-to-run variances moderated toward a prior fitted to this study: {text}"]


def failed_parts(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(run, part, error) of every measurement after training that failed in a run that kept
    its training record (runs.csv's `warnings`: trainscale.runners.guarded), by run path."""
    if not len(df) or "warnings" not in df.columns:
        return []
    table = df[["run", "warnings"]]  # two columns sorted, not every column of every run
    table = table[[isinstance(t, str) and t.startswith("[") for t in table["warnings"].tolist()]]
    out = []
    for run, text in table.sort_values("run").itertuples(index=False):
        out += [(run, w["part"], w["error"]) for w in json.loads(text)]
    return out


def cost_lines(scaling: pd.DataFrame) -> list[str]:
    """Per model and dataset, the cheapest cell per million units where it is not the fastest
    (cost per million where priced, else device-hours per million), and the devices no price
    applied to."""
    lines = []
    for r in cost.cheapest_and_fastest(scaling).itertuples(index=False):
        if not r.differ:
            continue
        if not lines:
            lines += ["", "cheapest per million tokens or samples, where not the fastest:"]
        value = cheapest_value(r, cost.currency(scaling))
        lines.append(
            f"  {r.model} on {r.dataset}: cheapest {r.cheapest} ({value}); fastest {r.fastest}"
        )
    warnings = cost.price_warnings(scaling)
    if warnings:
        lines += ["", "no money figure (config cost.device_hour):"]
        lines += [f"  {w}" for w in warnings]
    return lines


def cheapest_value(r, currency: str) -> str:
    """A cheapest cell's figure (a row of `cost.cheapest_and_fastest`): "0.00093 EUR per
    million" where priced, else "0.0233 device-hours per million"."""
    if r.by == "cost_per_million":
        return f"{human(r.cheapest_value)} {currency} per million".replace("  ", " ")
    return f"{human(r.cheapest_value)} device-hours per million"

"""Which cells a figure draws when they would not fit: at most MAX_LINES strategies in a panel
and MAX_FACETS facets a figure.

A panel whose lines are strategies and would hold more than MAX_LINES of them is drawn as one
panel per framework family (torch, tensorflow, horovod, deepspeed: the catalog's `framework`),
side by side, or above one another where the figure already has several columns; where a family
still holds too many, only the fastest MAX_LINES strategies plus `report.highlight` are drawn.

A figure whose facets would exceed MAX_FACETS first draws only the strategies that matter: per
model and dataset the FASTEST few (by the best mean throughput of any of their cells) plus
every strategy named in config `report.highlight`. Where that is not enough, or strategy is
not a facet of the figure, it is split into one figure per model. The caption of the figure
says which (`Part.note`), so a reader never mistakes a selection for the whole study.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd

from trainscale.analysis.aggregate import Study
from trainscale.plan import catalog
from trainscale.report.figures.registry import Kind

MAX_FACETS = 12
#: Strategies (lines) in one panel at most: beyond, close colours cross and the legend outgrows it.
MAX_LINES = 8
#: Facet columns a figure may grow to when it splits its panels by framework family.
MAX_COLUMNS = 4
#: Strategies kept per model and dataset when a figure must draw fewer (tried 3, 2, 1).
FASTEST = 3
GROUP = ["model", "dataset"]


@dataclass(frozen=True)
class Part:
    """One image of a figure: its cells, its file stem, its title and what the caption adds."""

    data: pd.DataFrame
    stem: str
    title: str
    note: str | None = None
    kind: Kind | None = None  # the facets it is drawn in, where they differ from the figure's


def speeds(study: Study) -> pd.Series:
    """(model, dataset, strategy) -> the best mean throughput of any of its cells."""
    s = study.scaling
    if not len(s) or "throughput_mean" not in s:
        return pd.Series(dtype=float)
    return s.groupby([*GROUP, "strategy"])["throughput_mean"].max()


def n_facets(d: pd.DataFrame, kind: Kind) -> int:
    """How many facets `kind` draws `d` in (row labels × column labels)."""
    row = [k for k in kind.row if k in d]
    col = [k for k in kind.col if k in d]
    rows = len(d[row].drop_duplicates()) if row else 1
    cols = len(d[col].drop_duplicates()) if col else 1
    return rows * cols


def fastest(
    d: pd.DataFrame, speed: pd.Series, k: int, highlight: Sequence[str]
) -> tuple[pd.DataFrame, list[str]]:
    """`d` cut to the k fastest strategies of each model and dataset plus `highlight`, and
    the strategies kept."""
    if not set(GROUP) <= set(d) or speed.empty:
        return d, sorted(d["strategy"].unique())
    ranked = (
        speed.reset_index()
        .sort_values("throughput_mean", ascending=False, kind="stable")
        .groupby(GROUP, sort=False)
        .head(k)
    )
    keep = set(map(tuple, ranked[[*GROUP, "strategy"]].to_numpy()))
    key = list(zip(d["model"], d["dataset"], d["strategy"], strict=True))
    mask = pd.Series([t in keep for t in key], index=d.index) | d["strategy"].isin(highlight)
    out = d[mask]
    return out, sorted(out["strategy"].unique())


def _reduce(
    d: pd.DataFrame, kind: Kind, speed: pd.Series, highlight: Sequence[str]
) -> tuple[pd.DataFrame, str | None]:
    """`d` itself when it fits, else the fewest cuts to the fastest strategies that fit (k=1
    when none does); with the sentence saying what was kept."""
    if n_facets(d, kind) <= MAX_FACETS or "strategy" not in (*kind.row, *kind.col):
        return d, None
    for k in range(FASTEST, 0, -1):
        cut, kept = fastest(d, speed, k, highlight)
        if n_facets(cut, kind) <= MAX_FACETS or k == 1:
            break
    named = [h for h in highlight if h in kept and h not in fastest(d, speed, k, ())[1]]
    plus = f" plus report.highlight ({', '.join(named)})" if named else ""
    return cut, (
        f"Draws only the strategies that matter: per model and dataset the {k} fastest "
        f"(best mean throughput of any cell){plus}; drawn: {', '.join(kept)}."
    )


def lines_per_panel(d: pd.DataFrame, kind: Kind) -> int:
    """The most strategies any one panel of `kind` draws `d` with."""
    keys = [k for k in (*kind.row, *kind.col) if k in d]
    if not keys:
        return d["strategy"].nunique()
    return int(d.groupby(keys, dropna=False)["strategy"].nunique().max())


def family(strategy: str) -> str:
    """A strategy's framework family (the catalog's `framework`); the name itself if unknown."""
    row = catalog.STRATEGIES.get(strategy)
    return row.framework if row else strategy


def by_family(
    d: pd.DataFrame, kind: Kind, speed: pd.Series, highlight: Sequence[str]
) -> tuple[pd.DataFrame, Kind, str | None]:
    """`d` and `kind` as drawn with at most MAX_LINES strategies a panel (the module doc), and
    the sentence saying how; unchanged where the lines are not strategies or already fit."""
    if kind.hue != "strategy" or "strategy" not in d or lines_per_panel(d, kind) <= MAX_LINES:
        return d, kind, None
    d = d.assign(family=d["strategy"].map(family))
    cols = len(d[[k for k in kind.col if k in d]].drop_duplicates()) if kind.col else 1
    wide = cols * d["family"].nunique() <= MAX_COLUMNS
    kind = (
        replace(kind, col=(*kind.col, "family"))
        if wide
        else replace(kind, row=(*kind.row, "family"))
    )
    families = ", ".join(sorted(d["family"].unique()))
    said = (
        f"More than {MAX_LINES} strategies in one panel: one panel per framework family "
        f"({families})"
    )
    if lines_per_panel(d, kind) <= MAX_LINES:
        return d, kind, said + "."
    cut, kept = fastest(d, speed, MAX_LINES, highlight)
    return (
        cut,
        kind,
        (
            f"{said}; still more in one family, so only the {MAX_LINES} fastest per model and "
            f"dataset plus report.highlight are drawn: {', '.join(kept)}."
        ),
    )


def parts(
    d: pd.DataFrame, kind: Kind, speed: pd.Series, highlight: Sequence[str] = ()
) -> list[Part]:
    """The images figure `kind` is drawn as: one, or one per model (see the module doc)."""
    d, kind, lined = by_family(d, kind, speed, highlight)
    n = n_facets(d, kind)
    if n <= MAX_FACETS:
        return [Part(d, kind.name, kind.title, lined, kind)]
    too_many = f"{n} facets are more than {MAX_FACETS}."
    cut, said = _reduce(d, kind, speed, highlight)
    models = sorted(cut["model"].unique()) if "model" in cut else []
    if n_facets(cut, kind) <= MAX_FACETS or len(models) < 2:
        note = " ".join(filter(None, (lined, too_many, said)))
        return [Part(cut, kind.name, kind.title, note, kind)]
    out = []
    for i, model in enumerate(models):
        sub, said = _reduce(d[d["model"] == model], kind, speed, highlight)
        note = f"{too_many} Split, one figure per model ({len(models)}): this one {model}."
        out.append(
            Part(
                sub,
                kind.name if i == 0 else f"{kind.name}--{model}",
                f"{kind.title}: {model}",
                " ".join(filter(None, (lined, note, said))),
                kind,
            )
        )
    return out

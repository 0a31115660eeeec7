"""The figure kinds: each figure module registers its kind with `@figure(...)`, naming the
function that finds the kind's table in a study and the facets it is drawn in.

The kinds, their titles and categories are listed once, in reports/figures.yaml (read by
Snakemake too, without importing matplotlib); registering a name that is not listed there is
an error, and so is a listed name that no module registers (checked in `trainscale.report.figures`).

No figure without something to show, decided here for every kind (`shown`): a facet whose axis
(the kind's x, `axis` or `lines.x` in figures.yaml) has one value is left out, a figure left
with no facet is not drawn, and a sentence says what was left out and why ("batch size was not
varied: 256 only").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from matplotlib.figure import Figure

from trainscale.analysis.aggregate import Study
from trainscale.report.figures.style import label

REPORTS = Path(__file__).resolve().parents[4] / "reports"
#: name -> {title, category}; the single list of figure kinds (also read by report.smk).
FIGURES: dict[str, dict] = yaml.safe_load((REPORTS / "figures.yaml").read_text())


@dataclass(frozen=True)
class Kind:
    """One figure kind: `data(study)` is its table, or a sentence saying why the study has
    nothing to plot; `draw(table, kind)` draws it in facets of `row` × `col` keys."""

    name: str
    title: str
    category: str
    data: Callable[[Study], pd.DataFrame | str]
    draw: Callable[[pd.DataFrame, Kind], Figure]
    row: tuple[str, ...] = ()
    col: tuple[str, ...] = ()
    #: the column a facet must vary along to be drawn (figures.yaml `axis`, or `lines.x`)
    axis: str | None = None
    #: the key a line's colour stands for (figures.yaml `hue`, or `lines.hue`)
    hue: str | None = None


#: name -> Kind, in the order of reports/figures.yaml once every module is imported.
REGISTRY: dict[str, Kind] = {}


def figure(
    name: str,
    *,
    data: Callable[[Study], pd.DataFrame | str],
    row: tuple[str, ...] = (),
    col: tuple[str, ...] = (),
) -> Callable:
    """Register the decorated draw function as figure `name` (listed in figures.yaml)."""
    if name not in FIGURES:
        raise KeyError(f"figure {name!r} is not listed in {REPORTS / 'figures.yaml'}: add it")

    def register(draw: Callable[[pd.DataFrame, Kind], Figure]) -> Callable:
        info = FIGURES[name]
        lines = info.get("lines") or {}
        axis, hue = info.get("axis") or lines.get("x"), info.get("hue") or lines.get("hue")
        REGISTRY[name] = Kind(
            name, info["title"], info["category"], data, draw, row, col, axis, hue
        )
        return draw

    return register


def ok_cells(study: Study, col: str) -> pd.DataFrame | str:
    """The study's cells with a value of `col`, or why there are none."""
    s = study.scaling
    if not len(s) or not (s["ok"] > 0).any():
        return "the study has no ok run"
    d = s[s[col].notna()] if col in s else s.iloc[0:0]
    if d.empty:
        return f"no ok run recorded {col.removesuffix('_mean').replace('_', ' ')}"
    return d


#: How a left-out line names an axis.
AXIS_NAMES = {
    "world_size": "workers N",
    "batch_size": "batch size",
    "scale": "dataset scale",
    "epoch": "epoch",
    "bytes": "message size",
    "strategy": "strategy",
}


def _values(v: pd.Series) -> str:
    return ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in sorted(v.unique()))


def shown(kind: Kind, study: Study) -> tuple[pd.DataFrame | str, str | None]:
    """What figure `kind` draws for `study`: its table cut to the facets whose axis has two
    values or more, or the sentence saying why nothing is drawn; and, when only some facets
    were left out, the sentence saying which and why."""
    d = kind.data(study)
    if isinstance(d, str) or kind.axis is None or kind.axis not in d:
        return d, None
    keys = [k for k in (*kind.row, *kind.col) if k in d]
    name = AXIS_NAMES.get(kind.axis, kind.axis.replace("_", " "))
    if kind.axis in keys:  # the facets are its values: one facet shows them all
        keys = [k for k in keys if k != kind.axis]
    counts = (
        d.groupby(keys, dropna=False)[kind.axis].transform("nunique")
        if keys
        else pd.Series(d[kind.axis].nunique(), index=d.index)
    )
    keep = counts > 1
    if keep.all():
        return d, None
    if not keep.any():
        if d[kind.axis].nunique() == 1:
            return f"{name} was not varied: {_values(d[kind.axis])} only", None
        return (
            f"no panel has more than one {name} ({_values(d[kind.axis])} in different panels)",
            None,
        )
    gone = d[~keep].drop_duplicates(keys)
    # a panel is named by what tells it from the others (the strategy, say), not by its model
    # and dataset where the study has one of each
    named = [k for k in keys if d[k].nunique() > 1] or keys[-1:]
    which = [
        " · ".join(label(k, v) for k, v in zip(named, row, strict=True))
        for row in gone[named].head(3).itertuples(index=False)
    ]
    n = len(gone)
    more = f" and {n - 3} more" if n > 3 else ""
    return d[
        keep
    ], f"{n} panel{'s' if n > 1 else ''} with one {name} left out: {', '.join(which)}{more}"

"""The figure kinds: each figure module registers its kind with `@figure(...)`, naming the
function that finds the kind's table in a study and the facets it is drawn in.

The kinds, their titles and categories are listed once, in reports/figures.yaml (read by
Snakemake too, without importing matplotlib); registering a name that is not listed there is
an error, and so is a listed name that no module registers (checked in `trainscale.report.figures`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from matplotlib.figure import Figure

from trainscale.analysis.aggregate import Study

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
        REGISTRY[name] = Kind(name, info["title"], info["category"], data, draw, row, col)
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

"""The study's figures, drawn with matplotlib in seaborn's style from the study's tables, never
from raw files: the figure kinds, their registry, the facet engine and rendering in a pool.
May import: analysis and every stage below it.
"""

# Figure objects, no pyplot state; from `trainscale.analysis.aggregate.Study` (scaling.csv, one
# row per cell, and the per-epoch convergence table), so a figure shows exactly what the tables say.
# - `registry`: the kinds (reports/figures.yaml) and the `@figure` decorator modules register with;
# - `style`: colours (STRATEGY_COLOURS), labels and the theme;
# - `facets`: the facet engine (grid, legend, title, x axis);
# - `lined`: the generic figure of error-bar lines (`lines`, `LineOptions`) and its kinds;
# - `select`: what a figure draws when its panels would hold more than 8 strategies, or its
#   facets would exceed 12;
# - `ranking`, `scaling`, `timing`, `throughput`, `accuracy`, `resources`: the figure kinds
#   (`ranking`, strategies ranked by throughput, is the report's first);
# - `render`: drawing into PNG (and SVG) files, in a process pool.

from __future__ import annotations

from trainscale.report.figures import (  # noqa: F401
    accuracy,
    cost,
    ranking,
    resources,
    scaling,
    throughput,
    timing,
)
from trainscale.report.figures.registry import FIGURES, REGISTRY
from trainscale.report.figures.render import Drawn, plan, render, render_all, why_absent

_unregistered = sorted(set(FIGURES) - set(REGISTRY))
if _unregistered:
    raise ImportError(f"figures listed in reports/figures.yaml but not drawn: {_unregistered}")
_ordered = {name: REGISTRY[name] for name in FIGURES}  # the order of figures.yaml
REGISTRY.clear()
REGISTRY.update(_ordered)

__all__ = ["FIGURES", "REGISTRY", "Drawn", "plan", "render", "render_all", "why_absent"]

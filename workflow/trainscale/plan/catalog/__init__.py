"""The catalog: one row of facts per strategy and per model, and the rules that follow from them.

Every other module reads a strategy's or a model's facts here: the matrix (what may run), the
launcher (how it starts), the runners (which module trains it), aggregation and prediction (its
communication volume), the figures (its colour) and the config schema (its name). It imports no
framework and nothing of trainscale outside it, so the Snakefile and scripts load fast.

- `strategies`: the strategy rows and `why_not`, what a strategy cannot run;
- `models`: the built-in model rows;
- `cell`: one combination of the matrix as the rules see it;
- `rules`: the constraints the rows name (pipeline, Lightning, parameter-server, arrays);
- `tp`: the tensor-parallel rules (the degree, the batch a tp group shares).

Read it as `catalog.STRATEGIES`, `catalog.MODELS`, ...: the names below.
"""

from trainscale.plan.catalog.cell import Cell
from trainscale.plan.catalog.models import MODELS, Model, model
from trainscale.plan.catalog.rules import pipeline_batch
from trainscale.plan.catalog.strategies import (
    STRATEGIES,
    Strategy,
    comm_volumes,
    exposed_unmeasured,
    names,
    strategy,
    strategy_colours,
    why_not,
)
from trainscale.plan.catalog.tp import TENSOR_PARALLEL, data_replicas, tp_batch

__all__ = [
    "MODELS",
    "STRATEGIES",
    "TENSOR_PARALLEL",
    "Cell",
    "Model",
    "Strategy",
    "comm_volumes",
    "data_replicas",
    "exposed_unmeasured",
    "model",
    "names",
    "pipeline_batch",
    "strategy",
    "strategy_colours",
    "tp_batch",
    "why_not",
]

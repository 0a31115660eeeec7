"""The strategies' own constraints (catalog rows name them; trainscale.plan.catalog re-exports
them): torch-pipeline's stages, micro-batches, schedule and precision, Lightning's data and
fp16, tf-ps's precision and token data, and the strategies that train on in-memory arrays
only. Each takes a `Cell` and returns the reason it cannot run, or None. Imports no framework."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainscale.plan.catalog.cell import Cell

#: A constraint: the reason a user reads when `cell` cannot run, or None when it can.
Constraint = Callable[["Cell"], "str | None"]

#: torch-pipeline's precisions: fp16 would need a loss scaler that skips steps on every stage
PIPELINE_PRECISIONS = ("fp32", "bf16")
#: tf-ps's: tf-keras refuses mixed-precision policies under ParameterServerStrategy
PS_PRECISIONS = ("fp32",)


def pipeline_batch(batch_size: int, mode: str, world: int) -> tuple[int, int]:
    """(global, per-worker) batch of torch-pipeline: no data parallelism, so every stage sees
    the whole global batch (`per_worker` mode: batch_size × stages, weak scaling)."""
    gbs = batch_size * world if mode == "per_worker" else batch_size
    return gbs, gbs


# torch-pipeline's own constraints: one stage per worker, cut between the model's top-level
# blocks; the global batch is split into `microbatches` equal micro-batches.


def pipeline_stages(c: Cell) -> str | None:
    blocks = c.row.blocks
    if c.own is not None and blocks == 0:
        return (
            f"torch-pipeline: {c.model} has no `blocks` that run it end to end "
            f"(models.{c.model}.blocks): the pipeline cuts its stages between them"
        )
    if blocks < c.world:
        return (
            f"torch-pipeline: {c.model} has {blocks} blocks, too few for {c.world} pipeline "
            "stages (one per worker)"
        )
    return None


def pipeline_microbatches(c: Cell) -> str | None:
    gbs, _ = pipeline_batch(c.batch_size, c.batch_mode, c.world)
    if gbs % c.microbatches:
        return f"torch-pipeline: microbatches {c.microbatches} do not divide the batch of {gbs}"
    if gbs // c.microbatches < 2 and c.row.batchnorm:
        return f"torch-pipeline: {c.model} has BatchNorm: needs micro-batches of at least 2"
    return None


def pipeline_precision(c: Cell) -> str | None:
    """fp16 would need a loss scaler whose skipped steps agree across stages; there is none."""
    if c.precision not in PIPELINE_PRECISIONS:
        return (
            f"torch-pipeline: {c.precision} needs a loss scaler that skips steps on every stage "
            "alike; use bf16"
        )
    return None


def arrays_only(why: str) -> Constraint:
    """A strategy that trains on in-memory arrays only: the user's image files (`datasets:`),
    decoded while training, are dropped from its cells with `why`."""

    def rule(c: Cell) -> str | None:
        if not c.user_data:
            return None
        return f"{c.strategy}: trains on in-memory arrays only; {c.dataset} is image files: {why}"

    return rule


def lightning_data(c: Cell) -> str | None:
    if c.user_data or c.resized:
        return (
            f"lightning-ddp: trains on the in-memory arrays at their stored size; {c.dataset} "
            "is image files or resized by `image_size`, which Lightning's own DataLoader here "
            "does not read: use torch-ddp"
        )
    return None


def lightning_fp16(c: Cell) -> str | None:
    if c.precision == "fp16" and c.accelerator != "cuda":
        return "lightning-ddp: Lightning silently runs fp16 as bf16 on CPU; use precision bf16"
    return None


def pipeline_schedule(c: Cell) -> str | None:
    if c.schedule == "1f1b" and c.microbatches < c.world:
        return f"torch-pipeline: 1F1B needs microbatches ({c.microbatches}) ≥ stages ({c.world})"
    return None


def ps_precision(c: Cell) -> str | None:
    """tf-keras refuses mixed-precision policies under ParameterServerStrategy ("Mixed
    precision is not supported with the tf.distribute.Strategy: ParameterServerStrategyV2")."""
    if c.precision not in PS_PRECISIONS:
        return (
            f"tf-ps: {c.precision} is a mixed-precision policy, which tf-keras does not support "
            "under ParameterServerStrategy; use fp32"
        )
    return None


def ps_tokens(c: Cell) -> str | None:
    """Keras' model.fit under ParameterServerStrategy traces the input function once, with an
    InputContext of one pipeline (id 0), and runs that one graph on every worker: no worker
    learns its index, so the workers cannot read disjoint windows (tokens.TrainWindows by rank),
    and a seeded order would be the same on every worker."""
    if c.data_input == "tokens":
        return (
            "tf-ps: Keras' model.fit under ParameterServerStrategy gives every worker the same "
            "input graph and no worker index, so its workers cannot read disjoint windows of "
            f"{c.dataset} (each would train on the same windows in the same order); use "
            "tf-multiworker or horovod-keras"
        )
    return None

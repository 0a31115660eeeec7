"""The catalog's rules for tensor parallelism (trainscale.plan.catalog re-exports them): which
strategies take the matrix's `tp` axis, how their ranks form data-parallel replicas and split
the batch, and which cells they cannot run. Imports no framework."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainscale.plan.catalog.cell import Cell

#: The tensor-parallel strategies: the only ones that take a matrix `tp` above 1.
TENSOR_PARALLEL = ("torch-tp", "torch-fsdp-tp")


def data_replicas(strategy: str, world: int, tp: int = 1) -> int:
    """Data-parallel replicas of a run of `world` ranks: the pipeline's stages are one replica,
    a tensor-parallel group of `tp` ranks is one, every other rank is one."""
    if strategy == "torch-pipeline":
        return 1
    return world // tp if strategy in TENSOR_PARALLEL else world


def tp_batch(batch_size: int, mode: str, world: int, tp: int) -> tuple[int, int]:
    """(global, per-rank) batch of a tensor-parallel run: its ranks form world/tp data-parallel
    replicas of tp ranks, and every rank of a replica feeds the replica's whole batch. In
    `per_worker` mode batch_size counts per rank as for DDP (global = batch_size × world, so a
    device does the same work per step at any N: weak scaling); the per-rank batch is then
    batch_size × tp. ValueError when a global batch does not split over the replicas."""
    replicas = world // tp
    gbs = batch_size * world if mode == "per_worker" else batch_size
    if gbs % replicas:
        raise ValueError(f"global batch {gbs} does not split over {replicas} replicas")
    return gbs, gbs // replicas


def tp_strategies(c: Cell) -> str | None:
    """Common rule: only the tensor-parallel strategies take tp > 1."""
    if c.tp > 1 and c.strategy not in TENSOR_PARALLEL:
        return (
            f"{c.strategy} has no tensor parallelism: tp {c.tp} is for "
            f"{' and '.join(TENSOR_PARALLEL)}"
        )
    return None


def tp_degree(c: Cell) -> str | None:
    """torch-tp splits every layer over all ranks; torch-fsdp-tp is a 2-D mesh of dp × tp with
    both above 1 (tp = 1 is torch-fsdp, dp = 1 is torch-tp), each TP group inside one node."""
    if c.strategy == "torch-tp":
        if c.tp != c.world:
            return (
                f"torch-tp is tensor parallelism over all ranks: tp must equal workers × nodes "
                f"({c.world}), not {c.tp}; add {c.world} to matrix.tp"
            )
        return None
    if c.tp == 1:
        return "torch-fsdp-tp with tp 1 is torch-fsdp: give matrix.tp a degree above 1"
    if c.world % c.tp or c.tp == c.world:
        return (
            f"torch-fsdp-tp needs tp ({c.tp}) to divide workers × nodes ({c.world}) with a "
            "data-parallel degree above 1 (at dp 1 it is torch-tp)"
        )
    if c.workers % c.tp:
        return (
            f"torch-fsdp-tp keeps each tensor-parallel group inside a node: tp ({c.tp}) must "
            f"divide workers ({c.workers})"
        )
    return None


def tp_model(c: Cell) -> str | None:
    """The plan exists for the GPT family (tp_plans.gpt_plan) and for own models with a
    `tp_plan`; a GPT's heads, widths, vocabulary and sequence must split evenly."""
    row = c.row
    if c.own is not None:
        if not row.tp_plan:
            return (
                f"{c.strategy}: {c.model} gives no tensor-parallel plan "
                f"(models.{c.model}.tp_plan: a callable returning one block's plan)"
            )
        if not row.named_blocks:
            return (
                f"{c.strategy}: {c.model} names no blocks (models.{c.model}.blocks) to lay its "
                "tp_plan on"
            )
        return None
    if row.gpt is None:
        return (
            f"{c.strategy}: tensor parallelism splits attention and MLP layers by a plan "
            f"that exists for the GPT family and own models with a tp_plan; {c.model} has none"
        )
    _, heads, width = row.gpt
    splits = {"heads": heads, "width": width, "vocabulary": c.classes, "seq_len": c.seq_len}
    for what, n in splits.items():
        if n and n % c.tp:
            why = " (sequence parallelism splits the sequence)" if what == "seq_len" else ""
            return f"{c.strategy}: tp {c.tp} does not divide {c.model}'s {what} {n}{why}"
    return None


def tp_precision(c: Cell) -> str | None:
    """fp16 would need a GradScaler over DTensor gradients; torchtitan, whose recipe this is,
    trains in bf16."""
    if c.precision == "fp16":
        return (
            f"{c.strategy}: fp16 needs a loss scaler over DTensor gradients, which this runner "
            "(after torchtitan's bf16 recipe) does not use; use bf16"
        )
    return None

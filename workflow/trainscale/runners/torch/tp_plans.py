"""Tensor parallelism on DTensor: the plan that splits a GPT (and the user's blocks) over a
mesh dimension, and how it is laid on a model.

Megatron-LM's split, written as torchtitan writes it for `parallelize_module`: in each block
the attention's q, k and v projections are column-parallel (each rank holds whole heads) and
its output projection row-parallel; the MLP's first linear column-, its second row-parallel.
So a block's forward needs one all-reduce after the attention and one after the MLP (and
backward one each before them). The token embedding is split by vocabulary rows and the LM
head by vocabulary columns; their matrix is one (tied), sharded alike (`Shard(0)`) by both.

With sequence parallelism the residual stream between blocks is split along the sequence:
the norms run on each rank's share of the tokens (`SequenceParallel`), each all-reduce becomes
an all-gather before the column-parallel linears and a reduce-scatter after the row-parallel
ones (the same bytes), and activations outside attention and MLP take 1/tp of the memory.
The embedding's output (token plus position, which this GPT adds after the lookup) is
all-reduced and then cut along the sequence, where torchtitan's RoPE models reduce-scatter it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainscale.models.own import resolved
from trainscale.plan.own_models import OwnModel


def gpt_block_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan of one GPT block (trainscale.models.gpt.Block), by submodule name. The
    row-parallel outputs are all-reduced, or with sequence parallelism reduce-scattered along
    the sequence, whose norms then run on each rank's share and whose attention and MLP inputs
    are gathered first."""
    out = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=out),
        "mlp.fc": ColwiseParallel(),
        "mlp.proj": RowwiseParallel(output_layouts=out),
    }
    if sequence_parallel:
        for norm, layer in (("ln_1", "attn"), ("ln_2", "mlp")):
            plan[norm] = SequenceParallel()
            plan[layer] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
    return plan


def gpt_plan(layers: int, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan of a whole GPT (nn.Sequential: embedding, `layers` blocks, head), by module
    path: the embedding by vocabulary rows (its output all-reduced), every block's
    `gpt_block_plan`, the head by vocabulary columns (its logits all-gathered, so the loss is
    the loop's own cross-entropy on full logits)."""
    head = layers + 1
    plan: dict[str, ParallelStyle] = {
        "0.tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    }
    if sequence_parallel:
        plan["0"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    for i in range(1, head):
        plan.update({f"{i}.{k}": v for k, v in gpt_block_plan(sequence_parallel).items()})
    if sequence_parallel:
        plan[f"{head}.ln_f"] = SequenceParallel()
    plan[f"{head}.out"] = ColwiseParallel(
        input_layouts=Shard(1) if sequence_parallel else Replicate(), output_layouts=Replicate()
    )
    return plan


def own_block_plan(own: OwnModel) -> dict[str, ParallelStyle]:
    """The user's `tp_plan` callable's plan of one block (a dict of submodule name -> style),
    called with the builder's keywords where it takes **kwargs (an `hf:` model's reads its
    config); TypeError naming the key when it returns anything else."""
    fn = resolved(own, "tp_plan")
    params = inspect.signature(fn).parameters.values()
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    plan = fn(**own.builder_kwargs) if takes_kwargs else fn()
    if not isinstance(plan, dict) or not all(isinstance(v, ParallelStyle) for v in plan.values()):
        raise TypeError(
            f"models.{own.name}.tp_plan ({own.tp_plan}) returned {type(plan).__name__}, not a "
            "dict of submodule name -> ParallelStyle (ColwiseParallel(), RowwiseParallel(), ...)"
        )
    return plan


def parallelize(
    net: nn.Module,
    mesh: DeviceMesh,
    blocks: Sequence[nn.Module],
    own: OwnModel | None,
    sequence_parallel: bool,
) -> bool:
    """Lay tensor parallelism over `mesh` on `net` in place: a GPT's whole-model plan, or the
    user's plan on each of its `blocks` that has the plan's submodules (the rest stays
    replicated: every rank of the group computes it on the same data). Ties the GPT's head to
    its embedding again (parallelize_module gives each a DTensor of its own). Returns whether
    sequence parallelism is on."""
    if own is None:
        layers = len(blocks) - 2
        parallelize_module(net, mesh, gpt_plan(layers, sequence_parallel))
        net[-1].out.weight = net[0].tokens.weight
        return sequence_parallel
    plan = own_block_plan(own)
    split = [b for b in blocks if all(_has(b, name) for name in plan)]
    if not split:
        raise ValueError(
            f"models.{own.name}.tp_plan ({own.tp_plan}) names {sorted(plan)}, which no module "
            f"of models.{own.name}.blocks ({own.blocks}) has all of: name submodules of one block"
        )
    for block in split:
        parallelize_module(block, mesh, plan)
    return any(isinstance(s, SequenceParallel) for s in plan.values())


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True

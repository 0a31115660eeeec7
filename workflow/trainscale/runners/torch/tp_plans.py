"""Tensor parallelism on DTensor: the plan that splits a GPT (and the user's blocks) over a
mesh dimension, how it is laid on a model, and the loss and scores of logits split by
vocabulary.

Megatron-LM's split, written as torchtitan writes it for `parallelize_module`: in each block
the attention's q, k and v projections are column-parallel (each rank holds whole heads) and
its output projection row-parallel; the MLP's first linear column-, its second row-parallel.
So a block's forward needs one all-reduce after the attention and one after the MLP (and
backward one each before them).

The vocabulary is split too, as torchtitan splits it: the token embedding by rows
(`RowwiseParallel`: each rank looks up the ids of its share and the lookups are all-reduced)
and the LM head by columns (`ColwiseParallel` with its output left split, `Shard(-1)`), so each
rank computes the logits of its share of the vocabulary only, and the cross-entropy runs on
them (tp_loss: a max and a sum over the tp group per token, not the logits gathered). For Llama
3's 128,256 ids the logits are the model's largest activation: each rank holds 1/tp of them. In
the GPT the two share one matrix (tied), sharded alike (`Shard(0)`) by both; an own model (and
an `hf:` model) names its embedding and head by module path (`models.NAME.embedding`,
`models.NAME.head`), tied or not.

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

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainscale.models.own import resolved, submodule
from trainscale.plan.runspec import OwnModel
from trainscale.runners.torch.tp_loss import token_losses


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


def embedding_style() -> ParallelStyle:
    """A token embedding split by vocabulary rows: the ids whole on every rank, each rank's
    lookups (zero for ids outside its share) all-reduced into the whole embedding."""
    return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())


def head_style(sequence_parallel: bool = False) -> ParallelStyle:
    """An LM head split by vocabulary columns: its input whole (or split along the sequence,
    gathered first), its logits left split by vocabulary, a DTensor for tp_loss."""
    return ColwiseParallel(
        input_layouts=Shard(1) if sequence_parallel else Replicate(),
        output_layouts=Shard(-1),
        use_local_output=False,
    )


def gpt_plan(layers: int, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan of a whole GPT (nn.Sequential: embedding, `layers` blocks, head), by module
    path: the embedding by vocabulary rows (its output all-reduced), every block's
    `gpt_block_plan`, the head by vocabulary columns (its logits split by vocabulary, the loss
    computed on them by tp_loss)."""
    head = layers + 1
    plan: dict[str, ParallelStyle] = {"0.tokens": embedding_style()}
    if sequence_parallel:
        plan["0"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    for i in range(1, head):
        plan.update({f"{i}.{k}": v for k, v in gpt_block_plan(sequence_parallel).items()})
    if sequence_parallel:
        plan[f"{head}.ln_f"] = SequenceParallel()
    plan[f"{head}.out"] = head_style(sequence_parallel)
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
    user's plan on each of its `blocks` that has the plan's submodules and its embedding and
    head split by vocabulary where it names them (the rest stays replicated: every rank of the
    group computes it on the same data). Ties a head to its embedding again
    (parallelize_module gives each a DTensor of its own). Returns whether sequence parallelism
    is on."""
    if own is None:
        layers = len(blocks) - 2
        parallelize_module(net, mesh, gpt_plan(layers, sequence_parallel))
        net[-1].out.weight = net[0].tokens.weight
        return sequence_parallel
    plan = own_block_plan(own)
    for block in split_blocks(blocks, own, plan):
        parallelize_module(block, mesh, plan)
    split_vocabulary(net, mesh, own)
    return any(isinstance(s, SequenceParallel) for s in plan.values())


def split_blocks(blocks: Sequence[nn.Module], own: OwnModel, plan: dict) -> list[nn.Module]:
    """The own model's `blocks` that have every submodule its one-block `plan` names (the
    plan is laid on those); ValueError naming the keys where none has."""
    split = [b for b in blocks if all(_has(b, name) for name in plan)]
    if not split:
        raise ValueError(
            f"models.{own.name}.tp_plan ({own.tp_plan}) names {sorted(plan)}, which no module "
            f"of models.{own.name}.blocks ({own.blocks}) has all of: name submodules of one block"
        )
    return split


def split_modules(net: nn.Module, blocks: Sequence[nn.Module], own: OwnModel | None):
    """The modules whose work `parallelize` splits over the group, each whole (a block the
    plan is laid on, the embedding, the head): what runs outside them runs whole on every
    rank (the FLOP count's hardware figure counts it once per rank, flop_count.py)."""
    if own is None:  # the GPT: every block, the token embedding and the head's matrix
        return [net[0].tokens, *blocks[1:-1], net[-1].out]
    named = [submodule(net, path) for path in (own.embedding, own.head) if path]
    return [*split_blocks(blocks, own, own_block_plan(own)), *named]


def split_vocabulary(net: nn.Module, mesh: DeviceMesh, own: OwnModel) -> None:
    """The own model's `embedding` and `head` (module paths, where it names them) split by
    vocabulary: the head's logits a DTensor split by vocabulary, the blocks' input and output
    whole as they were; a head whose matrix was the embedding's stays tied to it."""
    embedding = submodule(net, own.embedding) if own.embedding else None
    head = submodule(net, own.head) if own.head else None
    tied = embedding is not None and head is not None and head.weight is embedding.weight
    if embedding is not None:
        parallelize_module(embedding, mesh, embedding_style())
    if head is not None:
        parallelize_module(head, mesh, head_style())
    if tied:
        head.weight = embedding.weight


def token_scores(logits: DTensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each token's cross-entropy, whether its argmax is the next id), both (B, T), of logits
    (B, T, V) split by vocabulary over a 1-D mesh, without gathering them: the loss under
    `tp_loss.token_losses`, the argmax from each rank's largest logit and its id, gathered over
    the group (the first largest wins, as argmax's does)."""
    mesh = logits.device_mesh
    losses = token_losses(logits, y)
    best, index = logits.to_local().max(-1)
    share = -(-logits.shape[-1] // mesh.size())  # DTensor's shards: torch.chunk's
    index = index + share * mesh.get_local_rank()
    bests, indices = _gathered(best, mesh), _gathered(index, mesh)
    argmax = indices.gather(0, bests.argmax(0, keepdim=True)).squeeze(0)
    return losses, argmax == y


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def _gathered(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Every rank's `t` of the 1-D `mesh`, stacked in rank order."""
    out = t.new_empty((mesh.size() * t.shape[0], *t.shape[1:]))
    dist.all_gather_into_tensor(out, t.contiguous(), group=mesh.get_group())
    return out.view(mesh.size(), *t.shape)

"""Activation checkpointing (matrix `activation_checkpointing`, trainscale.plan.knobs): each
block's activations recomputed in the backward pass instead of kept from the forward.

- `full`: the block's forward under `torch.utils.checkpoint` (non-reentrant): only its input
  is kept, and backward runs its forward again first.
- `selective`: the same, with PyTorch's selective checkpointing policy: the outputs of matrix
  multiplies and attention (`SAVED`) are kept, the rest (norms, activations, adds, reshapes)
  recomputed; torchtitan's selective mode keeps the same operations. Under tensor parallelism
  with sequence parallelism it keeps the row-parallel layers' reduce-scatters too, as
  torchtitan's policy does: recomputed, they would run again in the backward pass, and their
  time would count as computation's.

BatchNorm in a checkpointed block (an image model's stage under `full`) runs twice per step,
and the recomputation would update its running statistics a second time: while a block
recomputes, its BatchNorms run with a momentum of 0 and their count of batches is put back, so
`running_mean`, `running_var` and `num_batches_tracked` move once per step, as without
checkpointing (the batch's own statistics normalise it either way).

The blocks are a GPT's transformer blocks, an `hf:` model's decoder layers, an own model's
`blocks` and an image model's stages with parameters. Their `forward` is replaced in place,
as `compile_blocks` does, so the model keeps its modules and names: FSDP's units, tensor
parallelism's plan, the pipeline's stages and the state dict see the same blocks, and their
hooks run around the checkpointed forward. Applied right after the build, before any wrapping
(torchtitan applies it before FSDP).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from trainscale.models import gpt
from trainscale.models import torch_models as models
from trainscale.plan.runspec import OwnModel

_aten = torch.ops.aten
#: the operations whose outputs `selective` keeps: matrix multiplies and attention, and
#: sequence parallelism's reduce-scatters (a collective recomputed is a collective run twice)
SAVED = frozenset(
    {
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten.baddbmm.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_cudnn_attention.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
    }
)


def blocks(net: nn.Module, own: OwnModel | None) -> list[nn.Module]:
    """The modules checkpointing wraps: a GPT's `Block`s (not its embedding or head), an own
    model's `blocks` (an `hf:` model's decoder layers), an image model's stages with
    parameters."""
    if own is not None:
        return models.blocks(net, own)
    return [b for b in models.blocks(net) if isinstance(b, gpt.Block)] or [
        b for b in models.blocks(net) if any(True for _ in b.parameters())
    ]


def apply(net: nn.Module, own: OwnModel | None, mode: str) -> None:
    """Checkpoint each of `net`'s blocks in place (`mode` full or selective; none: nothing)."""
    if mode == "none":
        return
    for block in blocks(net, own):
        norms = tuple(m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
        context = None
        if mode == "selective":
            context = functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)
        if norms:
            context = functools.partial(_statistics_kept_in_recomputation, context, norms)
        block.forward = functools.partial(_checkpointed, block.forward, context)


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward, context, *args, **kwargs):
    if context is not None:
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _statistics_kept_in_recomputation(context, norms: tuple[nn.Module, ...]):
    """checkpoint's (forward, recomputation) contexts: `context`'s (or none), the
    recomputation's leaving the running statistics of `norms` as they are."""
    forward, recompute = context() if context is not None else (contextlib.nullcontext(),) * 2
    return forward, _untracked(recompute, norms)


@contextlib.contextmanager
def _untracked(recompute, norms: tuple[nn.Module, ...]):
    """Inside `recompute`, each BatchNorm of `norms` runs as in training with a momentum of 0
    (its running statistics times 1 plus the batch's times 0: unchanged, to the bit, and the
    same operation with the same saved tensors as in the forward pass, which checkpoint
    compares), and its count of batches is put back after."""
    kept = [(m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone())
            for m in norms]  # fmt: skip
    with recompute:
        for m in norms:
            m.momentum = 0.0
        try:
            yield
        finally:
            for m, (momentum, count) in zip(norms, kept, strict=True):
                m.momentum = momentum
                if count is not None:
                    m.num_batches_tracked.copy_(count)

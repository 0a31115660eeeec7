"""Activation checkpointing (matrix `activation_checkpointing`, trainscale.plan.knobs): each
block's activations recomputed in the backward pass instead of kept from the forward.

- `full`: the block's forward under `torch.utils.checkpoint` (non-reentrant): only its input
  is kept, and backward runs its forward again first.
- `selective`: the same, with PyTorch's selective checkpointing policy: the outputs of matrix
  multiplies and attention (`SAVED`) are kept, the rest (norms, activations, adds, reshapes)
  recomputed; torchtitan's selective mode keeps the same operations.

The blocks are a GPT's transformer blocks, an `hf:` model's decoder layers, an own model's
`blocks` and an image model's stages with parameters. Their `forward` is replaced in place,
as `compile_blocks` does, so the model keeps its modules and names: FSDP's units, tensor
parallelism's plan, the pipeline's stages and the state dict see the same blocks, and their
hooks run around the checkpointed forward. Applied right after the build, before any wrapping
(torchtitan applies it before FSDP).
"""

from __future__ import annotations

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
from trainscale.plan.own_models import OwnModel

_aten = torch.ops.aten
#: the operations whose outputs `selective` keeps: matrix multiplies and attention
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
        block.forward = functools.partial(_checkpointed, block.forward, mode == "selective")


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward, selective: bool, *args, **kwargs):
    if selective:
        context = functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)

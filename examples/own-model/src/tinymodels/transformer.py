"""The pre-norm transformer block both PyTorch models share.

Why a module of its own: the image model and the language model differ only in what goes in
(patches or token ids), whether attention is causal and what comes out, so the block is
written once. Each block takes one tensor (B, T, C) and returns one of the same shape, which
is what a pipeline stage boundary and an FSDP shard unit need.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention: q, k and v projections (C, C) each, then (C, C) out.

    ``F.scaled_dot_product_attention`` lets each backend pick its fused kernel (flash
    attention on a GPU that has it). The parameters are those of ``nn.MultiheadAttention``
    and of Keras' ``MultiHeadAttention``: 4·C² + 4·C, so a Keras twin counts the same. The
    head count is read from the projections' width (``view(b, t, -1, head_width)``), so under
    tensor parallelism (``tp_plan``) each rank runs the heads it holds.
    """

    def __init__(self, width: int, heads: int, *, causal: bool) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.head_width, self.causal = width // heads, causal
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_width).transpose(1, 2)
                   for p in (self.q, self.k, self.v))  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)): a pre-norm block with a GELU MLP of 4·C."""

    def __init__(self, width: int, heads: int, *, causal: bool) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, causal=causal)
        self.norm_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


def tp_plan() -> dict:
    """The tensor-parallel plan of one ``Block`` (config ``models.<name>.tp_plan``), by
    submodule name: Megatron-LM's split, q, k and v column-parallel (whole heads per rank) and
    the attention's output row-parallel, the MLP's first linear column- and its second
    row-parallel. trainscale applies it to every block of ``blocks`` that has these
    submodules; the embedding and the head are split by vocabulary where the config names
    them (``models.<name>.embedding``, ``models.<name>.head``), else stay whole on every
    rank."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(),
        "mlp.0": ColwiseParallel(),
        "mlp.2": RowwiseParallel(),
    }

"""A small causal language model in PyTorch: a GPT-style decoder, scaled down.

Token ids (B, T) get a learned token and position embedding, ``depth`` pre-norm blocks of
causal self-attention (each position sees only itself and the ones before it, so next-token
prediction cannot peek) and a GELU MLP, then a LayerNorm and a linear layer to logits
(B, T, V). trainscale computes the next-token cross-entropy from those logits.

Why everything sits in ``self.blocks`` (as in ``tinymodels.vit``): ``torch-pipeline`` cuts
``model.blocks`` into stages and ``torch-fsdp`` shards each block as a unit, which is the
model only when ``forward`` is ``self.blocks(ids)``. The head has its own matrix rather than
sharing the token embedding's (weight tying): a weight shared by the first and the last block
would sit in two pipeline stages and two FSDP units.

Parameters for vocabulary V, context T, depth L and width W:
V·W + T·W (embeddings) + L·(12·W² + 13·W) (blocks) + 2·W + W·V + V (head).
"""

from __future__ import annotations

import torch
from torch import nn

from tinymodels.transformer import Block


class Embed(nn.Module):
    """Ids (B, T) -> (B, T, W): token embedding plus learned position embedding."""

    def __init__(self, vocab_size: int, seq_len: int, width: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(seq_len, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(pos)


class Head(nn.Module):
    """Hidden states (B, T, W) -> logits (B, T, V): LayerNorm, then a linear layer."""

    def __init__(self, width: int, vocab_size: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x))


class TinyLM(nn.Module):
    """[Embed, Block × depth, Head] in ``self.blocks``; ``forward`` runs them in order."""

    def __init__(self, vocab_size: int, seq_len: int, depth: int, width: int, heads: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            Embed(vocab_size, seq_len, width),
            *(Block(width, heads, causal=True) for _ in range(depth)),
            Head(width, vocab_size),
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.blocks(ids)


def build(
    *, vocab_size: int, seq_len: int, depth: int = 2, width: int = 64, heads: int = 4
) -> TinyLM:
    """The model trainscale trains: (B, T) int64 ids, T ≤ seq_len -> (B, T, vocab_size) logits.

    trainscale passes ``vocab_size`` and ``seq_len`` from the data set and the matrix; the rest
    come from the study's ``kwargs``. Raises ValueError on a size it cannot build.
    """
    if min(vocab_size, seq_len, depth, width, heads) < 1:
        raise ValueError("vocab_size, seq_len, depth, width and heads must be positive")
    return TinyLM(vocab_size, seq_len, depth, width, heads)

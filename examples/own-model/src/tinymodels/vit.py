"""A small ViT-style image classifier in PyTorch (Dosovitskiy et al., 2021, scaled down).

Images (N, C, H, W) are cut into patch×patch squares by a strided convolution, each patch
becomes a token of width C' with a learned position added, ``depth`` pre-norm transformer
blocks mix the tokens, and the head normalises, averages over the tokens and classifies.
Mean pooling instead of a class token keeps every stage's input and output one plain tensor.

Why everything sits in ``self.blocks``: trainscale's ``torch-pipeline`` cuts ``model.blocks``
into contiguous stages and runs them one after another, which is only the model when the
model *is* those blocks end to end; ``torch-fsdp`` shards each of them as one unit. So the
patch embedding and the head are blocks too, and ``forward`` only calls ``self.blocks``.

Parameters for C channels, P patches of side p, depth L, width W and K classes:
C·p²·W + W (patch conv) + P·W (positions) + L·(12·W² + 13·W) (blocks) + 2·W + W·K + K (head).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tinymodels.transformer import Block


def patch_grid(height: int, width: int, patch: int) -> tuple[int, int, int, int]:
    """(rows, columns, bottom padding, right padding) of the patch grid.

    An image whose side is not a multiple of ``patch`` is padded with zeros at the bottom and
    right (as the Keras twin does) rather than refused, so any data set's shape builds.
    """
    rows, cols = math.ceil(height / patch), math.ceil(width / patch)
    return rows, cols, rows * patch - height, cols * patch - width


class PatchEmbed(nn.Module):
    """Images (N, C, H, W) -> tokens (N, P, W): one per patch, plus its learned position."""

    def __init__(self, input_shape: Sequence[int], patch: int, width: int) -> None:
        super().__init__()
        channels, height, side = input_shape
        rows, cols, self.pad_bottom, self.pad_right = patch_grid(height, side, patch)
        self.conv = nn.Conv2d(channels, width, kernel_size=patch, stride=patch)
        self.positions = nn.Parameter(torch.zeros(1, rows * cols, width))
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad_bottom or self.pad_right:
            x = F.pad(x, (0, self.pad_right, 0, self.pad_bottom))
        return self.conv(x).flatten(2).transpose(1, 2) + self.positions


class Head(nn.Module):
    """Tokens (N, P, W) -> logits (N, K): LayerNorm, mean over the tokens, a linear layer."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x).mean(dim=1))


class TinyViT(nn.Module):
    """[PatchEmbed, Block × depth, Head] in ``self.blocks``; ``forward`` runs them in order."""

    def __init__(
        self, input_shape: Sequence[int], classes: int, depth: int, width: int, heads: int,
        patch: int,
    ) -> None:  # fmt: skip
        super().__init__()
        self.blocks = nn.Sequential(
            PatchEmbed(input_shape, patch, width),
            *(Block(width, heads, causal=False) for _ in range(depth)),
            Head(width, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def build(
    *,
    input_shape: Sequence[int],
    classes: int,
    depth: int = 2,
    width: int = 64,
    heads: int = 4,
    patch: int = 4,
) -> TinyViT:
    """The model trainscale trains: (N, C, H, W) float images -> (N, classes) logits.

    trainscale passes ``input_shape`` (C, H, W) and ``classes`` from the data set; the rest
    come from the study's ``kwargs``. Digits (1×8×8) at patch 4 make 4 tokens, MNIST (1×28×28)
    49. Raises ValueError on a shape or size it cannot build, which the pre-flight reports.
    """
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {tuple(input_shape)}")
    if min(depth, width, heads, patch, classes) < 1:
        raise ValueError("depth, width, heads, patch and classes must be positive")
    return TinyViT(input_shape, classes, depth, width, heads, patch)

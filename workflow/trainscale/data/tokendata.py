"""Token windows for the PyTorch loops: one rank's training and test batches of a token set as
int64 tensors (inputs and next-token targets, (batch, seq_len) each).

The windows and their order are trainscale.data.tokens' (numpy, shared with the Keras loop);
this module only turns them into tensors, as trainscale.data.imagedata does for images. No
loader processes: a batch is one fancy index into a memory-mapped file.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from trainscale.data import tokens


class Batches:
    """`steps` and `epoch(e)` of a split's windows (tokens.TrainWindows or EvalWindows), as
    the PyTorch loops read a loader: tensors on the host."""

    def __init__(self, windows: tokens.TrainWindows | tokens.EvalWindows) -> None:
        self.windows = windows
        self.steps = getattr(windows, "steps", 0)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in self.windows.epoch(epoch):
            yield torch.from_numpy(x), torch.from_numpy(y)


def loaders(spec, rank: int, replicas: int, batch: int) -> tuple[Batches, Batches]:
    """(train, test) batches of rank `rank` of `replicas` data-parallel ranks: every epoch a
    seeded permutation of the training windows, this rank's every replicas-th; the test
    split's windows in order, strided over the ranks."""
    train = tokens.TrainWindows(
        tokens.spec_ids(spec, "train"), spec.seq_len, batch, rank, replicas, spec.seed, spec.scale
    )
    test = tokens.EvalWindows(
        tokens.spec_ids(spec, "test"), spec.seq_len, batch, rank, replicas, spec.eval_tokens
    )
    return Batches(train), Batches(test)

"""What every PyTorch-family runner shares besides the loop (runners/torch_loop.py): the
precisions, the in-memory tensors, the optimizer, the sampler's length, evaluation, the peak
memory of each phase, the device sync and the torchrun exit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainscale import data
from trainscale.classes import scores
from trainscale.matrix import RunSpec
from trainscale.memory import PhasePeaks

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def leave() -> None:
    """End a torchrun worker once every rank is done, without the process-group teardown.

    Tearing down a gloo group can deadlock at exit: a gloo worker thread frees the last
    collective's tensors while holding the group's lock and waits for the GIL, while the main
    thread holds the GIL and waits for that lock in ~ProcessGroupGloo (seen here as 2-rank
    runs hanging after their metrics were written). The results are written; leave."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sync(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock time covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_peaks(device: torch.device) -> PhasePeaks:
    """Training's and evaluation's peak memory apart: host RSS, and allocated device memory on
    a GPU (torch's peak counter, reset with the host's at every evaluation's start and end)."""
    if device.type != "cuda":
        return PhasePeaks()
    return PhasePeaks(
        lambda: torch.cuda.max_memory_allocated(device),
        lambda: torch.cuda.reset_peak_memory_stats(device),
    )


def to_tensors(arrays: data.Arrays, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Normalised float32 images and int64 labels, held in memory (on the GPU if there is one)
    so that feeding a step is one index operation, never a bottleneck."""
    mean = torch.tensor(arrays.mean).view(1, -1, 1, 1)
    std = torch.tensor(arrays.std).view(1, -1, 1, 1)

    def images(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x).float().div_(arrays.x_max).sub_(mean).div_(std)
        return t.to(device)

    return (
        images(arrays.train_x),
        torch.from_numpy(arrays.train_y).to(device),
        images(arrays.test_x),
        torch.from_numpy(arrays.test_y).to(device),
    )


def make_optimizer(spec: RunSpec, params) -> torch.optim.Optimizer:
    if spec.optimizer == "adam":
        return torch.optim.Adam(
            params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
        )
    return torch.optim.SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
    )


class Indexable:
    """A length for DistributedSampler: the training set replicated `scale` times."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def tally(totals: torch.Tensor, out: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> None:
    """Add one batch's weighted loss sum and confusion counts (row = true class, column =
    argmax) into `totals` = [loss sum, confusion k×k flattened], on the device: no sync."""
    k = out.shape[1]
    totals[0] += (F.cross_entropy(out, y, reduction="none").double() * w).sum()
    totals[1:] += torch.bincount(y * k + out.argmax(1), weights=w.double(), minlength=k * k)


def scored(totals: torch.Tensor, classes: int) -> dict:
    """The `test` block's accuracy, loss and confusion from summed `tally` totals."""
    t = totals.cpu()
    return scores(t[1:].view(classes, classes).tolist(), t[0].item())


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    rank: int,
    world: int,
    batch: int,
    classes: int,
    all_sum: Callable[[torch.Tensor], torch.Tensor],
    input_dtype: torch.dtype | None = None,
) -> dict:
    """Test accuracy, mean loss and the confusion matrix (trainscale.classes.scores); each rank
    scores its stride of the test set in batches of the training's per-worker batch (so
    evaluation needs no more memory than a step), then the ranks' sums are added in one
    collective (`all_sum`: the strategy's sum over ranks, returning the sum).

    Every rank runs the same number of equal-sized forward passes (the last stride is padded
    with a repeated sample that is not counted), because with sharded parameters (ZeRO-3,
    FSDP) each forward is a collective that all ranks must join.
    """
    model.eval()
    n = len(y)
    per_rank = -(-n // world)
    idx = rank + world * torch.arange(per_rank, device=y.device)
    counted = (idx < n).double()
    idx = idx.clamp(max=n - 1)
    totals = torch.zeros(1 + classes * classes, dtype=torch.float64, device=x.device)
    for i in range(0, per_rank, batch):
        sel, w = idx[i : i + batch], counted[i : i + batch]
        xb = x[sel] if input_dtype is None else x[sel].to(input_dtype)
        tally(totals, model(xb).float(), y[sel], w)
    totals = all_sum(totals)
    model.train()
    return scored(totals, classes)

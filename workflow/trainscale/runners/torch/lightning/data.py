"""What `lightning-ddp`'s Trainer reads (ddp.py): the torch loop's per-rank batches,
in the forms Lightning iterates, so that both strategies train on the same samples in the same
order and the difference between their rows is Lightning's loop alone.

- Images: `torch-ddp`'s DistributedSampler order cut into per-worker batches (`ShardBatches`),
  indexing the in-memory tensors (`InMemory`) through a DataLoader of `batch_size=None`.
- Tokens: the torch loop's own token loader (trainscale.data.tokendata), its first `steps`
  batches each epoch (`WindowEpochs`): the same windows, in the same order, per rank.

Lightning calls `set_epoch(e)` (0-based) on a loader's `sampler` before each epoch; the torch
loop numbers its epochs from 1, so Lightning's epoch e is the loop's epoch e + 1 in both. With
`grad_accum` k each batch reaches Lightning as k micro-batches (`MicroBatches`), and its
Trainer accumulates them (`accumulate_grad_batches`), as the torch loop's step does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from trainscale.data import tokendata
from trainscale.measure.datawait import DataWait
from trainscale.plan.matrix import RunSpec
from trainscale.runners.common import Rank
from trainscale.runners.torch.torch_parts import Indexable


class ShardBatches(Sampler):
    """torch-ddp's per-rank data order as a sampler of whole batches (index tensors).

    Lightning calls `set_epoch` with its 0-based epoch before each epoch; torch-ddp numbers
    its sampler's epochs from 1, so epoch e here is torch-ddp's epoch e + 1: the same order.
    """

    def __init__(self, spec: RunSpec, rk: Rank, n: int, steps: int, device: torch.device):
        self.sampler = DistributedSampler(
            Indexable(n * spec.scale),
            num_replicas=rk.world_size,
            rank=rk.rank,
            shuffle=True,
            seed=spec.seed,
            drop_last=True,
        )
        self.n, self.steps, self.b, self.device = n, steps, spec.per_worker_batch_size, device
        self.epoch = 1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch + 1

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        self.sampler.set_epoch(self.epoch)
        order = torch.tensor(list(self.sampler), device=self.device) % self.n  # scale folded
        for step in range(self.steps):
            yield order[step * self.b : (step + 1) * self.b]


class InMemory(Dataset):
    """The normalised training tensors; one item is one batch (an index tensor picks it)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __getitem__(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]

    def __len__(self) -> int:
        return len(self.y)


class WindowEpochs:
    """This rank's token batches as the torch loop feeds them (Loop.batches): each epoch the
    first `steps` batches of `loader.epoch(epoch)`, inputs and next-token targets moved to the
    device as int64 ids. Lightning reads it as an iterable of known length whose `sampler`
    takes `set_epoch`; no DataLoader, whose collation would only copy the batches again."""

    def __init__(self, loader: tokendata.Batches, steps: int, device: torch.device) -> None:
        self.loader, self.steps, self.device = loader, steps, device
        self.epoch = 1

    @property
    def sampler(self) -> WindowEpochs:
        """Where Lightning looks for `set_epoch` (lightning.fabric's _set_sampler_epoch)."""
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch + 1

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        dev = self.device
        for x, y in itertools.islice(self.loader.epoch(self.epoch), self.steps):
            yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)


class MicroBatches:
    """Each batch of `batches` as `k` micro-batches in order (torch.tensor_split, as the torch
    loop's step splits it); its length and sampler are the batches'."""

    def __init__(self, batches, k: int) -> None:
        self.batches, self.k = batches, k

    @property
    def sampler(self):
        return self.batches.sampler

    def __len__(self) -> int:
        return len(self.batches) * self.k

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in self.batches:
            yield from zip(x.tensor_split(self.k), y.tensor_split(self.k), strict=True)


class SizedWait(DataWait):
    """DataWait over the training batches, with their length (Lightning sizes the epoch from
    it) and their sampler (Lightning calls its set_epoch before each epoch, so the order is the
    torch loop's). Lightning's fetcher takes each batch synchronously: the time in next() is
    the data wait."""

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def sampler(self):
        return self._batches.sampler

"""PyTorch input pipeline for the user's image data sets, shared by every PyTorch-family loop.

Images are decoded while training (trainscale.data.imagedecode: Pillow, resize, centre crop) by
`loader_workers` DataLoader processes beside each training worker; a whole batch is turned into
normalised float32 NCHW in the loader process. Folders are split over ranks with the
DistributedSampler (drop_last, so no sample is repeated to even ranks out); WebDataset shards
are split over ranks and loader processes by the webdataset pipeline. Every rank takes the same
number of batches per epoch (`ImageLoader.steps`), so no rank waits at an all-reduce another
never reaches.

Built-in data sets stay in memory; `resize_batch` gives them `image_size` (seed 003: CIFAR-10
at 224×224) a batch at a time, instead of holding 50 000 enlarged images.

A loop uses it as (round two wires this into runners/torch/torch_loop.py):

    train, test = imagedata.loaders(spec, rank, world_size, cuda)
    for epoch in range(1, spec.epochs + 1):
        batches = datawait.DataWait(train.epoch(epoch))
        for x, y in batches: ...
        waits = imagedata.rank_waits(batches.seconds)  # a collective: every rank calls it
        recorder.epoch(...).update(datawait.epoch_fields(batches.seconds, waits))
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from trainscale.data.imagedecode import decode_file, equal_steps, existing_shards, rank_samples
from trainscale.data.imagesets import (
    ImageDataError,
    RankRead,
    folder_classes,
    folder_files,
    short_of_shards,
)

#: Batches each loader process prepares ahead (DataLoader prefetch_factor).
PREFETCH_FACTOR = 2


class Normalise:
    """Collate: [(uint8 HWC, label)] -> (float32 NCHW normalised, int64 labels), in the loader
    process (one vectorised pass per batch)."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
        self.inverse_std = 1.0 / (torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1) * 255.0)

    def __call__(self, samples: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = torch.from_numpy(np.stack([s[0] for s in samples])).permute(0, 3, 1, 2)
        images = torch.empty(pixels.shape, dtype=torch.float32)
        images.copy_(pixels)  # uint8 NHWC -> float32 NCHW in one pass, then in place:
        labels = torch.tensor([s[1] for s in samples], dtype=torch.int64)
        return images.sub_(self.mean).mul_(self.inverse_std), labels


class FolderImages(Dataset):
    """An imagefolder split: sample i is (uint8 HWC image, label); label = the position of its
    class folder among `classes` (the train split's, sorted)."""

    def __init__(self, root: str, size: tuple[int, int], classes: list[str] | None = None):
        self.classes = classes or folder_classes(root)
        self.files, self.labels = folder_files(root, self.classes)
        if not self.files:
            raise ImageDataError(f"{root}: no images in its class folders; add images")
        self.size = tuple(size)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return decode_file(self.files[i], self.size), self.labels[i]


@dataclass
class ImageLoader:
    """A DataLoader and the batches every rank takes from it per epoch (`steps`; None: all,
    for evaluation)."""

    loader: DataLoader
    steps: int | None
    sampler: DistributedSampler | None = None

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of epoch `epoch` (1-based): a fresh shuffle for folders."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
        return itertools.islice(self.loader, self.steps)


def _data_loader(dataset, loader_workers: int, pin_memory: bool, **kw) -> DataLoader:
    extra = {}
    if loader_workers > 0:
        extra = {"persistent_workers": True, "prefetch_factor": PREFETCH_FACTOR}
    return DataLoader(dataset, num_workers=loader_workers, pin_memory=pin_memory, **extra, **kw)


def _shard_loader(
    read: RankRead, shards: list[str], seed, collate, pin_memory: bool, steps: int | None
) -> ImageLoader:
    """Rank `read.rank`'s batches of WebDataset `shards` (batched in the pipeline); `steps`
    None: every batch, the last one partial (evaluation)."""
    pipeline = rank_samples(
        read, shards, seed, batch_size=read.batch_size, collate=collate, partial=steps is None
    )
    loader = _data_loader(pipeline, read.loader_workers, pin_memory, batch_size=None)
    return ImageLoader(loader, steps)


def train_loader(
    read: RankRead,
    seed: int = 0,
    pin_memory: bool = False,
) -> ImageLoader:
    """The training split of one rank: shuffled each epoch, `steps` full batches of
    `batch_size` (the per-worker batch), the same count on every rank, no sample twice."""
    collate = Normalise(read.source.mean, read.source.std)
    if read.source.format == "imagefolder":
        dataset = FolderImages(read.source.train, read.size)
        sampler = DistributedSampler(
            dataset,
            num_replicas=read.world_size,
            rank=read.rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
        )
        loader = _data_loader(
            dataset,
            read.loader_workers,
            pin_memory,
            batch_size=read.batch_size,
            sampler=sampler,
            collate_fn=collate,
            drop_last=True,
        )
        return ImageLoader(loader, len(loader), sampler)
    shards = existing_shards(read.source.train)
    steps = equal_steps(shards, read.world_size, read.loader_workers, read.batch_size)
    if steps == 0:  # the pre-flight check (plan.matrix) stops such a study before any job
        why = short_of_shards(
            read.source.train, read.world_size, read.loader_workers, read.batch_size
        )
        raise ImageDataError(f"{read.source.train}: {why}")
    return _shard_loader(read, shards, seed, collate, pin_memory, steps)


def eval_loader(
    read: RankRead,
    pin_memory: bool = False,
    classes: list[str] | None = None,
) -> ImageLoader:
    """The test split of one rank, in order: every test sample on exactly one rank (ranks may
    get one batch more or less: sum correct counts over ranks). Folders take the train split's
    class list (`classes`, default read from source.train) so labels mean the same."""
    collate = Normalise(read.source.mean, read.source.std)
    if read.source.format == "imagefolder":
        dataset = FolderImages(
            read.source.test, read.size, classes or folder_classes(read.source.train)
        )
        mine = Subset(dataset, range(read.rank, len(dataset), read.world_size))
        loader = _data_loader(
            mine, read.loader_workers, pin_memory, batch_size=read.batch_size, collate_fn=collate
        )
        return ImageLoader(loader, None)
    shards = existing_shards(read.source.test)
    return _shard_loader(read, shards, None, collate, pin_memory, None)


def loaders(
    spec, rank: int, world_size: int, cuda: bool, batch: int | None = None
) -> tuple[ImageLoader, ImageLoader]:
    """(train, test) loaders of a run spec (matrix.RunSpec) with a user data set
    (`spec.image_source` not None), for rank `rank` of `world_size` data-parallel ranks, in
    batches of `batch` (default: the spec's per-worker batch)."""
    read = RankRead(
        spec.image_source,
        tuple(spec.image_size),
        batch or spec.per_worker_batch_size,
        rank,
        world_size,
        spec.loader_workers,
    )
    return train_loader(read, spec.seed, cuda), eval_loader(read, cuda)


def rank_waits(seconds: float) -> list[float]:
    """Every rank's data wait of this epoch, in rank order (torch.distributed all_gather: every
    rank must call it), for datawait.epoch_fields; [seconds] when not distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [seconds]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, float(seconds))
    return out


def resize_batch(x: torch.Tensor, size: tuple[int, int] | None) -> torch.Tensor:
    """A built-in data set's float NCHW batch at `image_size` (bilinear, antialiased; the
    built-ins are square, so resizing a square to [H, H] needs no crop). Unchanged when
    `size` is None or already the batch's."""
    if size is None or tuple(x.shape[-2:]) == tuple(size):
        return x
    scale = max(size[0] / x.shape[-2], size[1] / x.shape[-1])
    cover = (max(size[0], round(x.shape[-2] * scale)), max(size[1], round(x.shape[-1] * scale)))
    out = torch.nn.functional.interpolate(
        x, size=cover, mode="bilinear", antialias=True, align_corners=False
    )
    top, left = (cover[0] - size[0]) // 2, (cover[1] - size[1]) // 2
    return out[..., top : top + size[0], left : left + size[1]]

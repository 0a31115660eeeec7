"""Decode the user's images and stream WebDataset shards: the part of the input pipeline the
PyTorch loader (trainscale.data.imagedata) and the tf.data one (trainscale.data.imagedata_tf) share.

Framework-free (Pillow, numpy, webdataset): images come out as uint8 HWC RGB arrays of the
configured size, so a loader process ships 4× fewer bytes than float32 and each framework
normalises a whole batch at once.

Resize, then centre crop: the image is scaled (aspect kept) until it covers [H, W], then its
centre [H, W] is cut out, as ImageNet evaluation does. JPEGs are decoded at reduced scale first
where that still covers the target (Pillow's `draft`, libjpeg's DCT scaling): a 500×375 photo
trained at 64×64 is decoded at 1/4 scale, several times faster, with the same result up to
resampling differences.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import random
from collections.abc import Iterator

import numpy as np

from trainscale.data.imagesets import (  # noqa: F401  (equal_steps: the loaders' import)
    ImageDataError,
    RankRead,
    equal_steps,
    expand_shards,
    pillow_error,
    rank_worker_shards,
    shard_size,
)

#: Samples each loader process holds to shuffle a shard stream (WebDataset reads sequentially).
SHUFFLE_BUFFER = 1000


def decode_image(raw: bytes, size: tuple[int, int], where: str) -> np.ndarray:
    """Encoded image bytes -> uint8 array (H, W, 3), resized to cover `size` [H, W] and centre
    cropped. A file Pillow cannot decode raises ImageDataError naming `where`."""
    from PIL import Image

    height, width = size
    try:
        with Image.open(io.BytesIO(raw)) as img:
            scale = max(height / img.height, width / img.width)
            cover = (math.ceil(img.width * scale), math.ceil(img.height * scale))
            img.draft("RGB", cover)  # JPEG only: decode at the smallest scale still covering
            rgb = img.convert("RGB")
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for a bad file
        raise ImageDataError(
            f"{where}: cannot be decoded as an image ({pillow_error(e)}); replace or remove it"
        ) from e
    scale = max(height / rgb.height, width / rgb.width)
    cover = (max(width, round(rgb.width * scale)), max(height, round(rgb.height * scale)))
    if cover != rgb.size:
        rgb = rgb.resize(cover, Image.BILINEAR)
    left, top = (cover[0] - width) // 2, (cover[1] - height) // 2
    if cover != (width, height):
        rgb = rgb.crop((left, top, left + width, top + height))
    return np.asarray(rgb, dtype=np.uint8)


def decode_file(path: str, size: tuple[int, int]) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ImageDataError(f"{path}: cannot be read ({e.strerror}); restore the file") from e
    return decode_image(raw, size, path)


class DecodeSample:
    """WebDataset sample {__key__, __url__, jpg|jpeg|png, cls} -> (uint8 HWC image, label)."""

    def __init__(self, size: tuple[int, int], classes: int) -> None:
        self.size, self.classes = tuple(size), classes

    def __call__(self, sample: dict) -> tuple[np.ndarray, int]:
        raw, label, where = raw_sample(sample, self.classes)
        return decode_image(raw, self.size, where), label


class RawSample:
    """WebDataset sample -> (encoded image bytes, label), for a framework that decodes itself
    (tf.data's parallel decode_image)."""

    def __init__(self, classes: int) -> None:
        self.classes = classes

    def __call__(self, sample: dict) -> tuple[bytes, int]:
        raw, label, _ = raw_sample(sample, self.classes)
        return raw, label


def raw_sample(sample: dict, classes: int) -> tuple[bytes, int, str]:
    """(image bytes, label, where) of a WebDataset sample; ImageDataError naming the shard and
    key when it lacks either or its label is out of range."""
    where = f"{sample.get('__url__')}: sample {sample.get('__key__')}"
    raw = next((sample[k] for k in ("jpg", "jpeg", "png") if k in sample), None)
    if raw is None or "cls" not in sample:
        missing = "image (.jpg/.png)" if raw is None else "label (.cls)"
        raise ImageDataError(f"{where}: has no {missing}; rewrite the shard")
    try:
        label = int(sample["cls"].decode().strip())
    except ValueError:
        label = -1
    if not 0 <= label < classes:
        raise ImageDataError(
            f"{where}: label {sample['cls'][:20]!r} is not a class index in 0..{classes - 1}; "
            "fix the shard or the data set's classes"
        )
    return raw, label, where


class RankShards:
    """WebDataset node splitter: rank `rank` of `world_size` takes every world_size-th shard
    (given explicitly, so it also splits without torch.distributed, e.g. under Horovod)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def __call__(self, src: Iterator) -> Iterator:
        yield from itertools.islice(src, self.rank, None, self.world_size)


class ShuffledShards:
    """Shuffles the shard order of one loader process, anew each pass (its own pass counter:
    persistent loader processes never see the main process's epoch)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.passes = seed, 0

    def __call__(self, src: Iterator) -> Iterator:
        shards = list(src)
        random.Random(f"{self.seed}/{self.passes}").shuffle(shards)
        self.passes += 1
        yield from shards


class ShuffledSamples:
    """Shuffles a sample stream through a buffer of SHUFFLE_BUFFER samples (shards are read
    sequentially), seeded per pass as ShuffledShards is."""

    def __init__(self, seed: int, buffer: int = SHUFFLE_BUFFER) -> None:
        self.seed, self.buffer, self.passes = seed, buffer, 0

    def __call__(self, src: Iterator) -> Iterator:
        rng = random.Random(f"{self.seed}/samples/{self.passes}")
        self.passes += 1
        held: list = []
        for sample in src:
            if len(held) < self.buffer:
                held.append(sample)
                continue
            i = rng.randrange(len(held))
            held[i], sample = sample, held[i]
            yield sample
        rng.shuffle(held)
        yield from held


def existing_shards(pattern: str) -> list[str]:
    """The shards of a pattern; raises ImageDataError naming the first missing one."""
    shards = expand_shards(pattern)
    if not shards:
        raise ImageDataError(f"no shard matches {pattern}; fix the data set's pattern")
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        raise ImageDataError(
            f"shard {missing[0]} does not exist ({len(missing)} of {len(shards)} missing in "
            f"{pattern}); restore it or fix the pattern"
        )
    return shards


def rank_samples(read: RankRead, shards: list[str], seed: int | None, **pipeline):
    """`shard_samples` of rank `read.rank` of `read.world_size` at `read.size`: the pipeline
    both the PyTorch loader and the tf.data one read shards through. `pipeline`: batch_size,
    collate, partial, decode."""
    return shard_samples(
        shards, read.size, read.source.classes, read.rank, read.world_size, seed, **pipeline
    )


def shard_samples(
    shards: list[str],
    size: tuple[int, int],
    classes: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int | None = None,
    batch_size: int | None = None,
    collate=None,
    partial: bool = True,
    decode: bool = True,
):
    """A webdataset.DataPipeline over `shards` for one rank: shards split over ranks
    (RankShards) and over loader processes (webdataset.split_by_worker), so no sample is read
    twice in an epoch; shard order and samples shuffled when `seed` is given; decoded to
    (uint8 HWC, label) (or left encoded, `decode=False`); batched by `collate` when
    `batch_size` is given. An iterable: PyTorch's DataLoader takes it as a Dataset, tf.data
    through from_generator."""
    import webdataset as wds

    stages: list = [wds.SimpleShardList(shards), RankShards(rank, world_size), wds.split_by_worker]
    if seed is not None:
        stages.append(ShuffledShards(seed))
    stages.append(wds.tarfile_to_samples(handler=wds.reraise_exception))
    if seed is not None:
        stages.append(ShuffledSamples(seed))
    stages.append(wds.map(DecodeSample(size, classes) if decode else RawSample(classes)))
    if batch_size is not None:
        stages.append(wds.batched(batch_size, collation_fn=collate, partial=partial))
    return wds.DataPipeline(*stages)

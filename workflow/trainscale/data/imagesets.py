"""The user's own image data sets (config `datasets:`): what they are, where their files are,
and whether they can be trained on, known before any job starts.

A data set is a name under `datasets:` with a `format` (`imagefolder`: class folders of image
files, as ImageNet ships; `webdataset`: tar shards of `<key>.jpg` + `<key>.cls` members) and a
`train` and `test` location. A built-in data set's name may appear there too, with only
`image_size`, to train it resized (seed 003: CIFAR-10 at 224×224 for VGG19).

This module imports neither torch nor TensorFlow (the Snakefile imports it at parse time);
Pillow is imported only to decode the sample of images the pre-flight check looks at. The
loaders that read these files while training are trainscale.data.imagedata (PyTorch) and
trainscale.data.imagedata_tf (tf.data).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainscale import data
from trainscale.data import tokensets

FORMATS: tuple[str, ...] = ("imagefolder", "webdataset")
#: File endings the readers take as images (Pillow and tf.io.decode_image read them all).
IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png")
#: Per-channel mean and std of [0, 1] pixels when a data set gives none: ImageNet's, the
#: statistics most photo data sets are normalised with.
DEFAULT_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
DEFAULT_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
#: Images per split the pre-flight check decodes (spread over the classes / first shard).
SAMPLE_IMAGES = 8
#: Keys a built-in data set's entry may have (it has its own files, classes and statistics).
BUILTIN_KEYS = frozenset({"image_size"})


class ImageDataError(data.DataError):
    """A user data set's file is missing, unreadable or not an image; the message names it."""


@dataclass(frozen=True)
class ImageSource:
    """Where a user data set's files are and how to read them; frozen into the run spec."""

    format: str
    train: str  # a folder (imagefolder) or a shard pattern (webdataset), absolute
    test: str
    classes: int
    mean: tuple[float, ...] = DEFAULT_MEAN
    std: tuple[float, ...] = DEFAULT_STD

    @classmethod
    def from_dict(cls, d: dict) -> ImageSource:
        return cls(
            d["format"],
            d["train"],
            d["test"],
            int(d["classes"]),
            tuple(d.get("mean", DEFAULT_MEAN)),
            tuple(d.get("std", DEFAULT_STD)),
        )


@dataclass(frozen=True)
class RankRead:
    """What one rank reads of a user data set: the images at `size` (H, W) in batches of
    `batch_size` (the per-worker batch), its share as rank `rank` of `world_size` data-parallel
    ranks, decoded by `loader_workers` (processes for PyTorch, parallel calls for tf.data).
    The PyTorch loaders (trainscale.data.imagedata) and the tf.data ones
    (trainscale.data.imagedata_tf) take it alike, for the training and the test split."""

    source: ImageSource
    size: tuple[int, int]
    batch_size: int
    rank: int = 0
    world_size: int = 1
    loader_workers: int = 0


def pillow_error(e: Exception) -> str:
    """Pillow's complaint about a file, without the in-memory buffer's address it names."""
    from PIL import UnidentifiedImageError

    return "not an image format Pillow reads" if isinstance(e, UnidentifiedImageError) else str(e)


# --- file listing (shared by the pre-flight check and both loaders) ---------------------------


def expand_shards(pattern: str) -> list[str]:
    """The shard files of a pattern: brace ranges (`train-{000000..000099}.tar`, expanded by
    `braceexpand` as webdataset does) and glob wildcards, in sorted order. Brace-expanded
    names are returned whether or not they exist (a missing one is an error, not a gap)."""
    from braceexpand import braceexpand

    out: list[str] = []
    for name in braceexpand(pattern):
        out.extend(sorted(glob.glob(name)) if glob.has_magic(name) else [name])
    return out


def folder_classes(root: str | Path) -> list[str]:
    """Class names of an imagefolder split: its sub-folders, sorted (label = position)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def folder_files(root: str | Path, classes: list[str]) -> tuple[list[str], list[int]]:
    """Every image file of an imagefolder split, in (class, file name) order, with its label."""
    files, labels = [], []
    for label, name in enumerate(classes):
        found = sorted(
            e.path
            for e in os.scandir(Path(root) / name)
            if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES)
        )
        files.extend(found)
        labels.extend([label] * len(found))
    return files, labels


def shard_keys(path: str) -> list[str]:
    """Sample keys of one tar shard that have an image member, in file order (tar headers
    only: the images are skipped, not read)."""
    keys: dict[str, None] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                folder, _, name = member.name.rpartition("/")
                stem, _, ext = name.partition(".")
                if member.isfile() and f".{ext.lower()}" in IMAGE_SUFFIXES:
                    keys[f"{folder}/{stem}" if folder else stem] = None
    except (OSError, tarfile.TarError) as e:
        raise ImageDataError(f"shard {path}: cannot be read as a tar file ({e})") from e
    return list(keys)


@lru_cache(maxsize=4096)
def shard_size(path: str) -> int:
    """Samples in one shard (cached: read once per process)."""
    return len(shard_keys(path))


def rank_worker_shards(
    shards: list[str], rank: int, world_size: int, loader_workers: int
) -> list[list[str]]:
    """The shards each loader process of rank `rank` reads, as RankShards then
    webdataset.split_by_worker split them (one list when loader_workers is 0)."""
    mine = shards[rank::world_size]
    workers = max(1, loader_workers)
    return [mine[w::workers] for w in range(workers)]


def equal_steps(shards: list[str], world_size: int, loader_workers: int, batch_size: int) -> int:
    """Full batches every rank can take in one epoch: the fewest over ranks of the sum over its
    loader processes of (their samples // batch_size). Every rank runs this many steps, so
    none waits at an all-reduce another never reaches; the rest of an epoch is left unread."""
    per_rank = [
        sum(
            sum(shard_size(s) for s in part) // batch_size
            for part in rank_worker_shards(shards, r, world_size, loader_workers)
        )
        for r in range(world_size)
    ]
    return min(per_rank)


def short_of_shards(pattern: str, ranks: int, loader_workers: int, batch: int) -> str | None:
    """Why `ranks` ranks, each reading its shards of `pattern` through `loader_workers` loader
    processes (webdataset's split: shards[rank::ranks], then by loader), cannot each take one
    full batch of `batch`, or None when they can: the one test the pre-flight check (before
    any job: trainscale.plan.matrix) and the loaders (at run time) both apply. Sizes are read
    from the shards' tar headers only where shard counts cannot settle it: with at least
    `batch` shards per loader process every rank has a full batch (a shard holds a sample;
    trainscale.data.imagecheck checks that), with fewer shards than ranks some rank has none."""
    shards = expand_shards(pattern)
    readers = max(1, loader_workers)
    if len(shards) >= ranks * readers * batch or not all(map(os.path.isfile, shards)):
        return None  # enough; or a shard is missing, which imagecheck and the loaders name
    if len(shards) >= ranks and equal_steps(shards, ranks, loader_workers, batch) > 0:
        return None
    return (
        f"{len(shards)} shards give some rank no full batch of {batch} with {ranks} ranks × "
        f"{readers} loader processes ({ranks * readers} readers, shards[rank::ranks] split "
        "over each rank's loaders); write more (smaller) shards, or use fewer workers or "
        "loader_workers"
    )


# --- config -> run spec ------------------------------------------------------------------------


#: config `datasets`: data set name -> its entry
Datasets = Mapping[str, Mapping[str, Any]]


def user_names(datasets: Datasets) -> set[str]:
    """Names under config `datasets` that are the user's own data sets (not built-in names)."""
    return {n for n in datasets if n not in data.DATASETS}


def source_of(name: str, datasets: Datasets) -> ImageSource | None:
    """The frozen ImageSource of a user data set of config `datasets` (paths made absolute,
    from the directory Snakemake runs in), or None for a built-in one."""
    entry = datasets.get(name)
    if name in data.DATASETS or entry is None or entry["format"] == tokensets.FORMAT:
        return None
    if entry["format"] == "imagefolder":
        classes = len(folder_classes(entry["train"]))
    else:
        classes = entry["classes"]
    return ImageSource.from_dict(
        {
            **entry,
            "train": os.path.abspath(entry["train"]),
            "test": os.path.abspath(entry["test"]),
            "classes": classes,
        }
    )


def run_fields(name: str, datasets: Datasets, loader_workers: int) -> dict:
    """The RunSpec fields of a data set: `image_size` (None: as stored), `image_source` (None:
    built-in, in memory), `loader_workers` (config `loader_workers`: loader processes beside
    each training worker; 0 for built-in sets, which need none) and `token_source` (the user's
    token files)."""
    entry = datasets.get(name) or {}
    size = entry.get("image_size")
    source = source_of(name, datasets)
    return {
        "image_size": tuple(size) if size else None,
        "image_source": source,
        "loader_workers": loader_workers if source else 0,
        "token_source": tokensets.source_of(name, datasets)
        if tokensets.is_tokens(name, datasets) else None,
    }  # fmt: skip


def info(name: str, datasets: Datasets, steps_per_epoch: int | None) -> data.DatasetInfo:
    """data.info for any name `matrix.dataset` may hold: a built-in (its shape changed to
    `image_size` when set) or a user data set (3 channels; sample counts are counted only when
    `steps_per_epoch` needs them, else 0: counting a million files at every parse is slow)."""
    entry = datasets.get(name) or {}
    size = entry.get("image_size")
    if tokensets.is_tokens(name, datasets):
        return tokensets.info(name, tokensets.source_of(name, datasets))
    if name in data.DATASETS:
        base = data.info(name)
        return dataclasses.replace(base, shape=(base.shape[0], *size)) if size else base
    source = source_of(name, datasets)
    n_train = n_test = 0
    if steps_per_epoch:
        n_train, n_test = count(source, "train"), count(source, "test")
    return data.DatasetInfo(name, (3, *size), source.classes, n_train, n_test, False, ())


def spec_info(spec: dict) -> data.DatasetInfo:
    """data.info for a run spec (RunSpec.to_dict()): what a runner, the metrics or a rule ask
    about its data set without the config at hand."""
    if spec.get("seq_len"):  # tokens: (seq_len,), the vocabulary as the classes
        shape, source = (spec["seq_len"],), spec.get("token_source")
        if source is None:  # a built-in token set
            return dataclasses.replace(data.info(spec["dataset"]), shape=shape)
        return data.DatasetInfo(spec["dataset"], shape, source["vocab_size"], 0, 0, False, (),
                                tokensets.FORMAT)  # fmt: skip
    size, source = spec.get("image_size"), spec.get("image_source")
    if source is None:
        base = data.info(spec["dataset"])
        return dataclasses.replace(base, shape=(base.shape[0], *size)) if size else base
    return data.DatasetInfo(spec["dataset"], (3, *size), source["classes"], 0, 0, False, ())


def data_block(spec: dict) -> dict:
    """The metrics' `data` fields that say what was trained on: `format` (imagefolder,
    webdataset, tokens for the user's token files, or memory for built-in arrays),
    `input_shape` ([C, H, W] as trained; [seq_len] for tokens) and `loader_workers`; for
    tokens also `seq_len` and `vocab_size`."""
    source = spec.get("image_source")
    if spec.get("seq_len"):
        return {
            "format": tokensets.FORMAT if spec.get("token_source") else "memory",
            "input_shape": [spec["seq_len"]],
            "loader_workers": 0,
            "seq_len": spec["seq_len"],
            "vocab_size": spec_info(spec).num_classes,
        }
    return {
        "format": source["format"] if source else "memory",
        "input_shape": list(spec_info(spec).shape),
        "loader_workers": spec.get("loader_workers", 0),
    }


def count(source: ImageSource, split: str) -> int:
    """Samples in one split of a user data set."""
    where = getattr(source, split)
    if source.format == "imagefolder":
        return len(folder_files(where, folder_classes(where))[0])
    return sum(shard_size(p) for p in expand_shards(where))


def shape_name(spec: dict) -> str:
    """A name for the data set's shape a job without the config can read back (`info_of`):
    the data set's own name when it is a built-in at its own size, else C×H×W×classes."""
    if spec.get("seq_len"):  # tokens: seq_len × vocabulary
        return f"{spec['seq_len']}x{spec_info(spec).num_classes}"
    if spec.get("image_source") is None and spec.get("image_size") is None:
        return spec["dataset"]
    i = spec_info(spec)
    return "x".join(str(v) for v in (*i.shape, i.num_classes))


def info_of(name: str) -> data.DatasetInfo:
    """data.info for a `shape_name`: a built-in's, or shape and classes read from C×H×W×K
    (T×V for tokens)."""
    if name in data.DATASETS:
        return data.info(name)
    parts = name.split("x")
    if len(parts) == 2 and all(v.isdigit() for v in parts):
        t, v = (int(p) for p in parts)
        return data.DatasetInfo(name, (t,), v, 0, 0, False, (), tokensets.FORMAT)
    try:
        c, h, w, k = (int(v) for v in name.split("x"))
    except ValueError:
        return data.info(name)  # raises: not a known data set
    return data.DatasetInfo(name, (c, h, w), k, 0, 0, False, ())

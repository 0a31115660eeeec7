"""Pre-flight check of the user's image data sets (config `datasets:`), before any job starts.

A run that meets a missing folder, an undecodable image or a label out of range an hour into a
study wastes the hour; these are found at parse time instead, each as one line naming the
config key and the fix. Only structure and a sample are checked (every class folder or shard
is looked at, SAMPLE_IMAGES images per split are decoded): decoding a million images would
make every `snakemake -n` slow. The loaders still name a bad file they meet while training.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from trainscale import data
from trainscale.data import names, tokensets
from trainscale.data.imagesets import (
    BUILTIN_KEYS,
    FORMATS,
    IMAGE_SUFFIXES,
    SAMPLE_IMAGES,
    expand_shards,
    folder_classes,
    pillow_error,
)

_WHERE = "relative paths are from the directory Snakemake runs in"


def problems(config: dict) -> list[str]:
    """Every problem of `datasets:` and of the names in `matrix.dataset`; empty when none.
    Safe on a config the schema has not accepted yet (problems it reports are skipped)."""
    datasets = config.get("datasets") or {}
    if not isinstance(datasets, dict):
        return []  # the schema check names it
    out = _unknown_names(config, datasets)
    used = names.matrix_names(config, "dataset")
    for name, entry in datasets.items():
        if not isinstance(entry, dict):
            continue
        key = f"datasets.{name}"
        if entry.get("format") == tokensets.FORMAT and name not in data.DATASETS:
            out.extend(tokensets.problems(name, entry, key, name in used))
            continue
        found = _entry_problems(name, entry, key)
        if not found and name in used and name not in data.DATASETS:
            found = _file_problems(entry, key)
        out.extend(found)
    return out


def _unknown_names(config: dict, datasets: dict) -> list[str]:
    return names.unknown(
        config, "dataset", data.DATASETS, datasets, "datasets",
        lambda name: f"to train on your own images, add datasets.{name}: {{format, train, test, "
        f"image_size}}, or your token files with datasets.{name}: {{format: tokens, train, "
        "test, vocab_size}; docs/data.md",
    )  # fmt: skip


def _entry_problems(name: str, entry: dict, key: str) -> list[str]:
    """Keys missing or not allowed in one entry of `datasets:`."""
    if name in data.DATASETS:
        extra = sorted(set(entry) - BUILTIN_KEYS)
        if extra:
            return [
                f"{key}: {', '.join(extra)} cannot be set for the built-in data set {name!r} "
                "(it has its own files, classes and statistics); keep only image_size, or "
                "give your data set another name"
            ]
        return []
    need = ["format", "train", "test", "image_size"]
    if entry.get("format") == "webdataset":
        need.append("classes")
    missing = [k for k in need if k not in entry]
    if missing:
        why = " (a webdataset's shards do not list their classes)" if "classes" in missing else ""
        return [
            f"{key}: missing {', '.join(missing)}{why}; a user data set needs format "
            f"({' or '.join(FORMATS)}), train, test and image_size [H, W]; docs/data.md"
        ]
    return []


def _file_problems(entry: dict, key: str) -> list[str]:
    if entry["format"] == "imagefolder":
        out = []
        classes = {}
        for split in ("train", "test"):
            found, problem = _folder_split(entry[split], f"{key}.{split}")
            classes[split] = found
            out.extend(problem)
        if out:
            return out
        if classes["train"] != classes["test"]:
            only_train = sorted(set(classes["train"]) - set(classes["test"]))
            only_test = sorted(set(classes["test"]) - set(classes["train"]))
            return [
                f"{key}.test: its classes differ from train's (only in train: {only_train[:5]}, "
                f"only in test: {only_test[:5]}); both splits need the same class folders"
            ]
        if "classes" in entry and entry["classes"] != len(classes["train"]):
            return [
                f"{key}.classes: {entry['classes']}, but {entry['train']} has "
                f"{len(classes['train'])} class folders; remove the key (imagefolder classes "
                "are counted from the folders) or fix the folders"
            ]
        return []
    out = []
    for split in ("train", "test"):
        out.extend(_shard_split(entry[split], entry["classes"], f"{key}.{split}"))
    return out


def _folder_split(root: str, key: str) -> tuple[list[str], list[str]]:
    """(class names, problems) of one imagefolder split; decodes one image from each of up to
    SAMPLE_IMAGES classes spread over the class list."""
    if not Path(root).is_dir():
        return [], [
            f"{key}: folder {root} does not exist ({_WHERE}); give the folder that holds one "
            "sub-folder of images per class (train/<class>/<image>.jpg)"
        ]
    classes = folder_classes(root)
    if not classes:
        return [], [
            f"{key}: {root} has no class sub-folders; an imagefolder split is one sub-folder "
            "of images per class (train/<class>/<image>.jpg)"
        ]
    first = {}
    for name in classes:
        path = next(
            (
                e.path
                for e in os.scandir(Path(root) / name)
                if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES)
            ),
            None,
        )
        if path is None:
            return classes, [
                f"{key}: class folder {Path(root) / name} has no images "
                f"({', '.join(IMAGE_SUFFIXES)}); add images or remove the folder"
            ]
        first[name] = path
    step = max(1, len(classes) // SAMPLE_IMAGES)
    for name in classes[::step][:SAMPLE_IMAGES]:
        problem = _decode_problem(Path(first[name]).read_bytes(), first[name], key)
        if problem:
            return classes, [problem]
    return classes, []


def _shard_split(pattern: str, classes: int, key: str) -> list[str]:
    """Problems of one webdataset split: its shards exist, and the first shard's first
    SAMPLE_IMAGES samples decode and carry a label (`.cls`) in 0..classes-1."""
    shards = expand_shards(pattern)
    if not shards:
        return [f"{key}: no shard matches {pattern} ({_WHERE}); fix the pattern"]
    missing = [s for s in shards if not Path(s).is_file()]
    if missing:
        return [
            f"{key}: {len(missing)} of {len(shards)} shards of {pattern} do not exist (first: "
            f"{missing[0]}); restore them or fix the pattern (brace range or glob)"
        ]
    try:
        samples = _first_samples(shards[0], SAMPLE_IMAGES)
    except (OSError, tarfile.TarError) as e:
        return [f"{key}: shard {shards[0]} cannot be read as a tar file ({e}); rewrite it"]
    if not samples:
        return [f"{key}: shard {shards[0]} holds no <key>.jpg/.png samples; rewrite it"]
    for sample_key, members in samples.items():
        where = f"{shards[0]}: sample {sample_key}"
        image = next((v for k, v in members.items() if f".{k}" in IMAGE_SUFFIXES), None)
        if image is None or "cls" not in members:
            return [
                f"{key}: {where} lacks its {'image' if image is None else '.cls label'}; "
                "every sample needs <key>.jpg (or .png) and <key>.cls (the class index)"
            ]
        problem = _decode_problem(image, where, key)
        if problem:
            return [problem]
        try:
            label = int(members["cls"].decode().strip())
        except ValueError:
            label = -1
        if not 0 <= label < classes:
            return [
                f"{key}: {where} has label {members['cls'][:20]!r}, not a class index in "
                f"0..{classes - 1}; fix the shard, or the data set's classes"
            ]
    return []


def _first_samples(shard: str, n: int) -> dict[str, dict[str, bytes]]:
    """The first `n` samples of a shard: key -> {extension: bytes}."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(shard, "r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, _, name = member.name.rpartition("/")
            stem, _, ext = name.partition(".")
            sample_key = f"{folder}/{stem}" if folder else stem
            if sample_key not in samples and len(samples) == n:
                break
            samples.setdefault(sample_key, {})[ext.lower()] = tar.extractfile(member).read()
    return samples


def _decode_problem(raw: bytes, where: str, key: str) -> str | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as img:
            img.load()
    except Exception as e:  # Pillow raises several types for a bad file
        why = pillow_error(e)
        return f"{key}: {where} cannot be decoded as an image ({why}); replace or remove it"
    return None

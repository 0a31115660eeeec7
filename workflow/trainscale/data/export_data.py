"""Write a built-in data set in the two layouts users bring their own images in, so the real-data
pipeline can be tried (and tested) without downloading ImageNet:

    OUT/imagefolder/{train,test}/<class>/<index>.jpg       JPEG class folders (ImageNet's layout)
    OUT/webdataset/{train,test}-{000000..}.tar             WebDataset shards: <key>.jpg + <key>.cls
    OUT/datasets.yaml                                      the `datasets:` entries for both

The token corpus (`shakespeare`) is written in the two token formats instead:

    OUT/nanogpt/{train,test}.bin                           nanoGPT's headerless uint16 ids
    OUT/llmc/{train,test}.bin                              llm.c shards (256-int32 header)

Both layouts hold the same JPEG bytes, so they decode to the same images. The shards are plain
POSIX tar files, written with the standard library in the order webdataset reads them (a
sample's members next to each other).

    trainscale export-data NAME DATA_DIR OUT [--shard-size N] [--limit N]
"""

from __future__ import annotations

import argparse
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

from trainscale import data
from trainscale.data import tokens

#: Built-in data sets that have real images or text to export (synthetic ones are noise).
EXPORTABLE: tuple[str, ...] = ("digits", "mnist", "cifar10", "shakespeare")
JPEG_QUALITY = 95


def jpeg_bytes(image: np.ndarray, x_max: float) -> bytes:
    """One uint8 (C, H, W) image (values 0..x_max) as JPEG: grayscale for C=1, else RGB."""
    from PIL import Image

    scaled = image.astype(np.float64) * (255.0 / x_max)
    pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels[0] if pixels.shape[0] == 1 else pixels.transpose(1, 2, 0))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(payload)
    member.mode = 0o644
    tar.addfile(member, io.BytesIO(payload))


def write_split(
    images: np.ndarray,
    labels: np.ndarray,
    x_max: float,
    split: str,
    out: Path,
    shard_size: int,
    classes: int,
) -> tuple[Path, str]:
    """Write one split in both layouts; returns (its folder, its shard brace pattern)."""
    folder = out / "imagefolder" / split
    width = len(str(classes - 1))
    for c in range(classes):
        (folder / f"{c:0{width}d}").mkdir(parents=True, exist_ok=True)
    shard_dir = out / "webdataset"
    shard_dir.mkdir(parents=True, exist_ok=True)
    shards = max(1, -(-len(labels) // shard_size))
    for s in range(shards):
        with tarfile.open(
            shard_dir / f"{split}-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT
        ) as tar:
            for i in range(s * shard_size, min(len(labels), (s + 1) * shard_size)):
                raw, label = jpeg_bytes(images[i], x_max), int(labels[i])
                (folder / f"{label:0{width}d}" / f"{i:06d}.jpg").write_bytes(raw)
                _add(tar, f"{i:06d}.jpg", raw)
                _add(tar, f"{i:06d}.cls", str(label).encode())
    return folder, f"{shard_dir}/{split}-{{000000..{shards - 1:06d}}}.tar"


def export(
    name: str,
    data_dir: str | Path,
    out: str | Path,
    shard_size: int = 200,
    limit: int | None = None,
) -> dict:
    """Write built-in data set `name` (its first `limit` train and test images, or all) under
    `out` in both layouts; returns the `datasets:` entries (also written to datasets.yaml)."""
    if name not in EXPORTABLE:
        raise ValueError(f"cannot export {name!r}; choose one of {', '.join(EXPORTABLE)}")
    if data.info(name).input == "tokens":
        return export_tokens(name, Path(out), limit)
    arrays = data.load(name, data_dir)
    out = Path(out)
    classes = arrays.info.num_classes
    size = list(arrays.info.shape[1:])
    entry = {"image_size": list(size), "classes": classes}
    places = {}
    for split, x, y in (
        ("train", arrays.train_x, arrays.train_y),
        ("test", arrays.test_x, arrays.test_y),
    ):
        places[split] = write_split(
            x[:limit], y[:limit], arrays.x_max, split, out, shard_size, classes
        )
    entries = {
        f"{name}-folders": {
            "format": "imagefolder",
            "train": str(places["train"][0]),
            "test": str(places["test"][0]),
            "image_size": list(size),
        },
        f"{name}-shards": {
            "format": "webdataset",
            "train": places["train"][1],
            "test": places["test"][1],
            **entry,
        },
    }
    return write_entries(out, entries)


def export_tokens(name: str, out: Path, limit: int | None = None) -> dict:
    """The byte corpus (its first `limit` tokens per split, or all) as nanoGPT .bin files and
    as llm.c shards, uint16 ids; returns the `datasets:` entries."""
    splits = dict(zip(("train", "test"), tokens.byte_corpus(), strict=True))
    entries = {}
    for kind, write in (("nanogpt", tokens.write_nanogpt), ("llmc", tokens.write_llmc)):
        paths = {s: write(ids[:limit], out / kind / f"{s}.bin") for s, ids in splits.items()}
        entries[f"{name}-{kind}"] = {
            "format": "tokens",
            **{s: str(path) for s, path in paths.items()},
            "vocab_size": data.info(name).num_classes,
        }
    return write_entries(out, entries)


def write_entries(out: Path, entries: dict) -> dict:
    """`entries` as OUT/datasets.yaml, ready to paste; returns them."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "datasets.yaml").write_text(
        "# paste under `datasets:` in a study config (docs/data.md)\n"
        + yaml.safe_dump({"datasets": entries}, sort_keys=False)
    )
    return entries


def main(argv: Sequence[str] | None = None, prog: str = "trainscale export-data") -> int:
    """`trainscale export-data NAME DATA_DIR OUT`: a built-in data set as image folders and
    shards (the token corpus: as nanoGPT .bin files and llm.c shards)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    p.add_argument("name", choices=EXPORTABLE, help="the built-in data set to export")
    p.add_argument("data_dir", help="where the built-in data set's files are (config data_dir)")
    p.add_argument("out", type=Path, help="the folder to write the image folders and shards into")
    p.add_argument("--shard-size", type=int, default=200, help="samples per tar shard")
    p.add_argument(
        "--limit", type=int, default=None, help="export only the first N per split (tokens: ids)"
    )
    a = p.parse_args(argv)
    entries = export(a.name, a.data_dir, a.out, a.shard_size, a.limit)
    print(yaml.safe_dump({"datasets": entries}, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

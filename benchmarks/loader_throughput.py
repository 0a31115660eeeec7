"""Images/s of trainscale's PyTorch image loader against a bare Pillow loop over the same files.

The loader (trainscale.data.imagedata.train_loader: DataLoader, `loader_workers` processes, decode +
resize + centre crop, batches normalised to float32 in the loader process) should lose little to
the bare loop a person would write (open, decode at reduced scale, resize, crop, to numpy),
per process it runs: target ratio >= 0.9 per loader worker, where

    ratio per worker = loader images/s / (max(1, loader_workers) × bare loop images/s)

(with 0 loader workers the loader decodes in the calling process, so it is compared with one
bare loop). The two are timed side by side, alternating, `--repeats` times each; min, median
and max are printed. The loader's first pass (its processes starting) is not timed.

    PYTHONPATH=workflow .venv/bin/python benchmarks/loader_throughput.py --workers 0 1 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from trainscale.data.imagedata import train_loader
from trainscale.data.imagesets import ImageSource, RankRead, folder_classes, folder_files


def write_jpegs(root: Path, count: int, width: int, height: int, classes: int = 10) -> None:
    """`count` photo-sized JPEGs (smooth colour fields with grain, so they compress like
    photos, not like flat colour), one class folder each of `classes`."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for i in range(count):
        a, b, c = rng.uniform(0.005, 0.05, 3)
        base = np.stack([np.sin(xx * a + i), np.cos(yy * b), np.sin((xx + yy) * c)], axis=-1)
        grain = rng.normal(0, 12, (height, width, 3))
        pixels = np.clip(base * 100 + 128 + grain, 0, 255).astype(np.uint8)
        folder = root / f"{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=90)


def bare_pillow(files: list[str], size: tuple[int, int]) -> float:
    """Seconds for one pass of the loop a person would write with Pillow alone."""
    height, width = size
    start = time.perf_counter()
    for path in files:
        with Image.open(path) as img:
            scale = max(height / img.height, width / img.width)
            img.draft("RGB", (math.ceil(img.width * scale), math.ceil(img.height * scale)))
            rgb = img.convert("RGB")
        scale = max(height / rgb.height, width / rgb.width)
        cover = (max(width, round(rgb.width * scale)), max(height, round(rgb.height * scale)))
        rgb = rgb.resize(cover, Image.BILINEAR)
        left, top = (cover[0] - width) // 2, (cover[1] - height) // 2
        np.asarray(rgb.crop((left, top, left + width, top + height)), dtype=np.uint8)
    return time.perf_counter() - start


def loader_pass(loader, epoch: int) -> tuple[float, int]:
    start = time.perf_counter()
    images = sum(len(y) for _, y in loader.epoch(epoch))
    return time.perf_counter() - start, images


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, default=256, help="JPEGs to write (default 256)")
    p.add_argument("--source", default="500x375", help="their size WxH (ImageNet's typical)")
    p.add_argument("--image-size", type=int, default=224, help="trained at SxS (default 224)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="loader_workers")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="an imagefolder split to use instead")
    p.add_argument("--threads", type=int, default=1, help="torch threads (threads_per_worker)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)  # as a training worker runs (loader processes: 1 each)
    size = (a.image_size, a.image_size)
    with tempfile.TemporaryDirectory() as tmp:
        root = a.dir
        if root is None:
            root = Path(tmp) / "train"
            width, height = (int(v) for v in a.source.split("x"))
            write_jpegs(root, a.images, width, height)
        files, _ = folder_files(root, folder_classes(root))
        source = ImageSource("imagefolder", str(root), str(root), len(folder_classes(root)))
        loaders = {
            w: train_loader(RankRead(source, size, a.batch, loader_workers=w)) for w in a.workers
        }
        for loader in loaders.values():
            loader_pass(loader, 0)  # start the loader processes, warm the page cache
        bare: list[float] = []
        rates: dict[int, list[float]] = {w: [] for w in a.workers}
        for r in range(a.repeats):  # alternating: bare loop, then each loader, per repeat
            bare.append(len(files) / bare_pillow(files, size))
            for w, loader in loaders.items():
                seconds, images = loader_pass(loader, r + 1)
                rates[w].append(images / seconds)
    print(
        f"{len(files)} JPEGs from {root if a.dir else a.source} -> {size[0]}x{size[1]}, "
        f"batch {a.batch}, {a.repeats} alternating repeats; images/s min / median / max"
    )

    def row(name: str, values: list[float], ratio: str = "") -> str:
        lo, mid, hi = min(values), statistics.median(values), max(values)
        return f"  {name:<24} {lo:8.1f} {mid:8.1f} {hi:8.1f}  {ratio}"

    base = statistics.median(bare)
    print(row("bare Pillow loop", bare, "ratio per worker (target >= 0.9)"))
    for w, values in rates.items():
        ratio = statistics.median(values) / (max(1, w) * base)
        print(row(f"loader, {w} loader workers", values, f"{ratio:.2f}"))


if __name__ == "__main__":
    main()

"""Data set file formats: the readers that turn published files into uint8 arrays.

MNIST's IDX files and CIFAR-10's binary version are parsed from their published byte layouts,
and every header is checked against the bytes behind it, so a truncated or foreign file fails
with its path and what is wrong. Nothing is ever unpickled, so a tampered data file cannot run
code. scikit-learn's bundled digits and the synthetic sets are made here too: every function
returns ``trainscale.data.catalogue.Arrays``.
"""

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

from trainscale.data.catalogue import (
    CIFAR_DIR,
    CIFAR_RECORD_BYTES,
    CIFAR_SUBDIR,
    CIFAR_TEST,
    CIFAR_TRAIN,
    IDX_IMAGES_MAGIC,
    IDX_LABELS_MAGIC,
    MNIST_DIR,
    MNIST_TEST,
    MNIST_TRAIN,
    NORM,
    Arrays,
    DataError,
    DatasetInfo,
)


def _read_gz(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise DataError(f"{path}: file not found") from exc
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"{path}: not a valid gzip file or truncated ({exc}); delete it and run "
            "`snakemake download` again"
        ) from exc


def _read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes: big-endian magic, ``ndim`` uint32 sizes, data."""
    raw = _read_gz(path)
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        kind = "images" if magic == IDX_IMAGES_MAGIC else "labels"
        raise DataError(
            f"{path}: wrong IDX magic number 0x{found:08X}, expected 0x{magic:08X} for {kind}; "
            "is this the right file?"
        )
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if dims[0] == 0:
        raise DataError(f"{path}: the header says the file holds no samples")
    need = header + math.prod(dims)
    if len(raw) < need:
        raise DataError(
            f"{path}: truncated: header says {dims} = {need - header} data bytes, "
            f"found {len(raw) - header}"
        )
    if len(raw) > need:
        raise DataError(
            f"{path}: {len(raw) - need} unexpected bytes after the {dims} data the header declares"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _check_labels(path: Path, labels: np.ndarray, num_classes: int) -> None:
    top = int(labels.max())
    if top >= num_classes:
        raise DataError(f"{path}: label {top} is out of range 0..{num_classes - 1}")


def _load_mnist_split(
    root: Path, names: tuple[str, str], meta: DatasetInfo
) -> tuple[np.ndarray, np.ndarray]:
    image_path = root / MNIST_DIR / names[0]
    label_path = root / MNIST_DIR / names[1]
    images = _read_idx(image_path, IDX_IMAGES_MAGIC, 3)
    if images.shape[1:] != meta.shape[1:]:
        raise DataError(
            f"{image_path}: images are {images.shape[1]}x{images.shape[2]}, "
            f"expected {meta.shape[1]}x{meta.shape[2]}"
        )
    labels = _read_idx(label_path, IDX_LABELS_MAGIC, 1)
    if len(labels) != len(images):
        raise DataError(
            f"{image_path} holds {len(images)} images but {label_path} holds {len(labels)} "
            "labels; the files do not belong together"
        )
    _check_labels(label_path, labels, meta.num_classes)
    return images.reshape(len(images), *meta.shape), labels.astype(np.int64)


def mnist_arrays(root: Path, meta: DatasetInfo) -> Arrays:
    """MNIST's four IDX files under ``root/mnist``, with the usual normalisation constants."""
    train_x, train_y = _load_mnist_split(root, MNIST_TRAIN, meta)
    test_x, test_y = _load_mnist_split(root, MNIST_TEST, meta)
    mean, std = NORM["mnist"]
    return Arrays(meta, train_x, train_y, test_x, test_y, 255.0, mean, std)


def _read_cifar_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DataError(f"{path}: file not found") from exc
    if not raw or len(raw) % CIFAR_RECORD_BYTES:
        raise DataError(
            f"{path}: {len(raw)} bytes is not a whole number of {CIFAR_RECORD_BYTES}-byte records "
            "(1 label byte + 3072 pixel bytes); the file is truncated or not from the CIFAR-10 "
            "binary version"
        )
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR_RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    _check_labels(path, labels, 10)
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def cifar10_arrays(root: Path, meta: DatasetInfo) -> Arrays:
    """CIFAR-10's five training batches and its test batch (binary version) under ``root``."""
    base = root / CIFAR_DIR / CIFAR_SUBDIR
    parts = [_read_cifar_bin(base / f) for f in CIFAR_TRAIN]
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    test_x, test_y = _read_cifar_bin(base / CIFAR_TEST)
    mean, std = NORM["cifar10"]
    return Arrays(meta, train_x, train_y, test_x.copy(), test_y, 255.0, mean, std)


def digits_arrays(meta: DatasetInfo) -> Arrays:
    """scikit-learn's bundled 8x8 digits (real data that works offline), split 1437/360 with a
    fixed, stratified split so every run of every strategy sees the same test set.

    The split is kept in the user's cache (digits_cache): importing scikit-learn to make it
    costs about 1.5 s, more than a short run's training, and every run of a study would pay it.
    """
    cached = digits_cache()
    if cached is not None and cached.exists():
        try:
            with np.load(cached) as z:
                return Arrays(
                    meta, z["train_x"], z["train_y"], z["test_x"], z["test_y"], 16.0,
                    tuple(z["mean"].tolist()), tuple(z["std"].tolist()),
                )  # fmt: skip
        except Exception:  # noqa: BLE001 (any damage, e.g. cut short: made again below)
            pass
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:
        raise DataError(
            "the 'digits' dataset needs scikit-learn: pip install scikit-learn"
        ) from exc
    bunch = load_digits()
    x = bunch.images.astype(np.uint8)[:, None, :, :]  # pixel counts 0..16
    y = bunch.target.astype(np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        x, y, test_size=meta.test_samples, stratify=y, random_state=0
    )
    scaled = train_x.astype(np.float64) / 16.0
    mean = tuple(float(v) for v in scaled.mean(axis=(0, 2, 3)))
    std = tuple(float(v) for v in scaled.std(axis=(0, 2, 3)))
    if cached is not None:
        _save_atomically(
            cached, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
            mean=np.array(mean), std=np.array(std),
        )  # fmt: skip
    return Arrays(meta, train_x, train_y, test_x, test_y, 16.0, mean, std)


def digits_cache() -> Path | None:
    """Where the digits split is kept: $XDG_CACHE_HOME (or ~/.cache)/trainscale, one file per
    scikit-learn version (the split is scikit-learn's); None without scikit-learn."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        sklearn = version("scikit-learn")
    except PackageNotFoundError:
        return None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainscale"
    return base / f"digits-split-sklearn-{sklearn}.npz"


def _save_atomically(path: Path, **arrays: np.ndarray) -> None:
    """np.savez to a temporary file renamed into place, so that runs starting together never
    read half a file; a cache that cannot be written (read-only home) is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError:
        pass


def synthetic_arrays(meta: DatasetInfo, seed: int, samples: int | None = None) -> Arrays:
    """Random images and labels; `samples` training images instead of the data set's own count
    (config `samples`), with a test set of at most as many."""
    n_train = samples or meta.train_samples
    n_test = min(meta.test_samples, n_train)
    rng = np.random.default_rng(seed)
    train_x = rng.integers(0, 256, size=(n_train, *meta.shape), dtype=np.uint8)
    train_y = rng.integers(0, meta.num_classes, size=n_train, dtype=np.int64)
    test_x = rng.integers(0, 256, size=(n_test, *meta.shape), dtype=np.uint8)
    test_y = rng.integers(0, meta.num_classes, size=n_test, dtype=np.int64)
    channels = meta.shape[0]
    return Arrays(
        meta, train_x, train_y, test_x, test_y, 255.0, (0.5,) * channels, (0.25,) * channels
    )

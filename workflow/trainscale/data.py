"""Datasets for trainscale: real or synthetic images as uint8 numpy arrays.

This module imports numpy only, on purpose: the Snakefile imports it at parse time (to list the
files a study needs and fail before any job starts, with a message that says what to do), and the
PyTorch and TensorFlow runners share it, so it must not pull in either framework.

Images stay uint8 ``(N, C, H, W)`` in memory (4x smaller than float32); a runner converts one
batch at a time with ``x / x_max`` and the per-channel ``mean``/``std``.

Real files are parsed from their published binary formats (MNIST IDX, CIFAR-10 binary version).
Nothing is ever unpickled, so a tampered data file cannot run code.

Command line (used by the ``download`` Snakemake rule)::

    python -m trainscale.data download <name> <data_dir>
    python -m trainscale.data check <name> <data_dir>
"""

import argparse
import gzip
import hashlib
import http.client
import logging
import math
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "CIFAR_RECORD_BYTES",
    "CIFAR_RECORDS_PER_FILE",
    "DATASETS",
    "SOURCES",
    "Arrays",
    "DataError",
    "DatasetInfo",
    "Source",
    "download",
    "info",
    "load",
    "main",
    "missing_files",
    "missing_message",
    "verify",
]

_log = logging.getLogger(__name__)

DATASETS: tuple[str, ...] = (
    "digits",
    "mnist",
    "cifar10",
    "synthetic-mnist",
    "synthetic-cifar10",
    "synthetic-imagenet",
)


class DataError(Exception):
    """Missing, corrupt or unreachable data; the message says which file and what to do."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset, known without reading any file."""

    name: str
    shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int
    train_samples: int
    test_samples: int
    synthetic: bool
    files: tuple[str, ...]  # relative to data_dir; empty when nothing is read from disk


@dataclass
class Arrays:
    """A loaded dataset. Images are uint8 (N, C, H, W); labels int64 (N,)."""

    info: DatasetInfo
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    x_max: float  # divide by this to get [0, 1]: 255, or 16 for digits
    mean: tuple[float, ...]  # per channel, of x / x_max
    std: tuple[float, ...]  # per channel, of x / x_max


# --- static facts ------------------------------------------------------------------------------

_MNIST_DIR = "mnist"
_MNIST_TRAIN = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
_MNIST_TEST = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
_IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte data, 3 dimensions
_IDX_LABELS_MAGIC = 0x00000801  # unsigned byte data, 1 dimension

_CIFAR_DIR = "cifar10"
_CIFAR_SUBDIR = "cifar-10-batches-bin"  # the directory the official archive unpacks to
_CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_TEST = "test_batch.bin"
CIFAR_RECORD_BYTES = 1 + 3 * 32 * 32  # 1 label byte, then 1024 R, 1024 G, 1024 B (row-major)
CIFAR_RECORDS_PER_FILE = 10_000  # every official .bin file holds exactly this many records

_INFO: dict[str, DatasetInfo] = {
    "digits": DatasetInfo("digits", (1, 8, 8), 10, 1437, 360, False, ()),
    "mnist": DatasetInfo(
        "mnist",
        (1, 28, 28),
        10,
        60_000,
        10_000,
        False,
        tuple(f"{_MNIST_DIR}/{f}" for f in (*_MNIST_TRAIN, *_MNIST_TEST)),
    ),
    "cifar10": DatasetInfo(
        "cifar10",
        (3, 32, 32),
        10,
        50_000,
        10_000,
        False,
        tuple(f"{_CIFAR_DIR}/{_CIFAR_SUBDIR}/{f}" for f in (*_CIFAR_TRAIN, _CIFAR_TEST)),
    ),
    "synthetic-mnist": DatasetInfo("synthetic-mnist", (1, 28, 28), 10, 60_000, 10_000, True, ()),
    "synthetic-cifar10": DatasetInfo(
        "synthetic-cifar10", (3, 32, 32), 10, 50_000, 10_000, True, ()
    ),
    # ImageNet-shaped synthetic data is kept small on purpose: 1280 + 256 images of 3x224x224
    # uint8 are ~230 MB, and every data-parallel worker process holds its own copy, so the full
    # 1.28 M images (~190 GB) could never be generated in memory. A throughput study only needs
    # enough distinct batches to keep the input pipeline honest (tf_cnn_benchmarks and Horovod's
    # synthetic benchmarks reuse a single batch); 1280 = 10 batches of 128.
    "synthetic-imagenet": DatasetInfo(
        "synthetic-imagenet", (3, 224, 224), 1000, 1280, 256, True, ()
    ),
}

# Usual normalisation constants (of x / 255), as used by torchvision examples.
_NORM: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


def info(name: str) -> DatasetInfo:
    """Static facts about ``name``; reads no file, so the Snakefile can call it at parse time."""
    try:
        return _INFO[name]
    except KeyError:
        raise ValueError(
            f"unknown dataset {name!r}; valid choices: {', '.join(DATASETS)}"
        ) from None


# --- download sources --------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One downloadable file: where it lands, where to fetch it, and its published MD5.

    The file lands at ``data_dir/dest/filename``. For an archive, ``members`` names the only
    entries extracted (into ``data_dir/dest``); the archive itself is deleted afterwards.
    """

    filename: str
    urls: tuple[str, ...]  # mirrors, tried in order
    md5: str
    dest: str
    members: tuple[str, ...] = ()


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
# MD5s as published with the dataset (and as torchvision checks them).
_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}

SOURCES: dict[str, tuple[Source, ...]] = {
    "mnist": tuple(
        Source(f, tuple(m + f for m in _MNIST_MIRRORS), _MNIST_MD5[f], _MNIST_DIR)
        for f in (*_MNIST_TRAIN, *_MNIST_TEST)
    ),
    "cifar10": (
        Source(
            "cifar-10-binary.tar.gz",
            ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
            "c32a1d4ab5d03f1284b67883e8d87530",
            _CIFAR_DIR,
            members=tuple(f"{_CIFAR_SUBDIR}/{f}" for f in (*_CIFAR_TRAIN, _CIFAR_TEST)),
        ),
    ),
}


# --- missing files -----------------------------------------------------------------------------


def missing_files(name: str, data_dir: str | Path) -> list[Path]:
    """The required files of ``name`` that are absent, so a study can stop before any job runs."""
    root = Path(data_dir)
    return [root / f for f in info(name).files if not (root / f).is_file()]


def missing_message(name: str, data_dir: str | Path) -> str:
    """Tell the user which files are missing, where exactly to put them, and how to get them."""
    root = Path(data_dir).expanduser().absolute()
    missing = missing_files(name, root)
    total = len(info(name).files)
    if not missing:
        return f"all {total} files of dataset {name!r} are present under {root}"
    lines = [
        f"dataset {name!r}: {len(missing)} of {total} required files are missing under {root}:",
        *(f"  - {p}" for p in missing),
        "",
        "To fetch and verify them (needs internet), run:",
        "  snakemake download",
        f"which calls: python -m trainscale.data download {name} {root}",
        "",
        "Offline? Download these on a machine with internet access and copy them by hand:",
    ]
    for src in SOURCES.get(name, ()):
        lines.append(f"  {src.urls[0]}  (md5 {src.md5})")
        lines.extend(f"    mirror: {url}" for url in src.urls[1:])
        if src.members:
            lines.append(
                f"    then unpack it: tar -xzf {src.filename} -C {root / src.dest}"
                f"  (creates {_CIFAR_SUBDIR}/ there)"
            )
        else:
            lines.append(
                f"    save it, unchanged (still gzipped), as {root / src.dest / src.filename}"
            )
    if name == "cifar10":
        lines.append(
            "  Use the BINARY version (cifar-10-binary.tar.gz), not the python pickles: "
            "trainscale never unpickles data."
        )
    lines += [
        "",
        f"For a pure-throughput study without real data, use synthetic-{name} instead.",
    ]
    return "\n".join(lines)


# --- verification ------------------------------------------------------------------------------


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cifar_bin_bytes() -> int:
    return CIFAR_RECORDS_PER_FILE * CIFAR_RECORD_BYTES


def verify(name: str, data_dir: str | Path) -> None:
    """Check the files on disk are the published ones, so a bad copy fails before training.

    MNIST: MD5 of each .gz file. CIFAR-10: its MD5 belongs to the archive (checked during
    download), so the extracted .bin files are checked by size. Raises DataError.
    """
    root = Path(data_dir)
    meta = info(name)
    if not meta.files:
        return
    if missing_files(name, root):
        raise DataError(missing_message(name, root))
    if name == "mnist":
        for src in SOURCES["mnist"]:
            path = root / src.dest / src.filename
            actual = _md5(path)
            if actual != src.md5:
                raise DataError(
                    f"{path}: MD5 mismatch (expected {src.md5}, got {actual}); the file is corrupt "
                    "or not the official one. Delete it and run `snakemake download` again."
                )
    elif name == "cifar10":
        expected = _cifar_bin_bytes()
        for rel in meta.files:
            path = root / rel
            size = path.stat().st_size
            if size != expected:
                raise DataError(
                    f"{path}: {size} bytes, expected {expected} ({CIFAR_RECORDS_PER_FILE} records "
                    f"of {CIFAR_RECORD_BYTES} bytes); the file is truncated or not from the "
                    "CIFAR-10 binary version. Delete it and run `snakemake download` again."
                )


# --- download ----------------------------------------------------------------------------------

_NETWORK_ERRORS = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException)


def _fetch(url: str, target: Path, timeout: float) -> str:
    """Stream ``url`` into ``target``, returning its MD5."""
    digest = hashlib.md5(usedforsecurity=False)
    request = urllib.request.Request(url, headers={"User-Agent": "trainscale-data/0.1"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(target, "wb") as out:
        for chunk in iter(lambda: response.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _download_verified(name: str, src: Source, root: Path, timeout: float) -> Path:
    """Download ``src`` to a temporary file next to its target and return it once its MD5 matches.

    The temporary file lives in the target directory so the final rename is atomic; it is
    removed on any failure, so a partial or wrong download never looks like a good file.
    """
    directory = root / src.dest
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{src.filename}.", suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    errors: list[str] = []
    try:
        for url in src.urls:
            _log.info("downloading %s", url)
            try:
                actual = _fetch(url, tmp, timeout)
            except _NETWORK_ERRORS as exc:
                errors.append(f"  {url}: {exc}")
                continue
            if actual != src.md5:
                raise DataError(
                    f"{directory / src.filename}: MD5 mismatch for the download from {url} "
                    f"(expected {src.md5}, got {actual}); the file was discarded."
                )
            return tmp
        raise DataError(
            f"could not download {src.filename} for dataset {name!r}: no source could be "
            "reached (are we offline?). Tried:\n"
            + "\n".join(errors)
            + "\n\n"
            + missing_message(name, root)
        )
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _extract_members(src: Source, archive: Path, root: Path) -> list[Path]:
    """Extract only ``src.members`` from ``archive`` into ``root/src.dest``.

    Nothing but the expected regular-file members is extracted, with tarfile's "data" filter
    as a second line of defence against path traversal, links and device files.
    """
    directory = root / src.dest
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=".extract-"))
    try:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                by_name = {m.name: m for m in tar.getmembers()}
                chosen = []
                for member in src.members:
                    entry = by_name.get(member)
                    if entry is None:
                        raise DataError(f"{src.filename}: the archive has no member {member!r}")
                    if not entry.isreg():
                        raise DataError(
                            f"{src.filename}: member {member!r} is not a regular file; refusing it"
                        )
                    chosen.append(entry)
                tar.extractall(staging, members=chosen, filter="data")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise DataError(f"{src.filename}: cannot read the archive ({exc})") from exc
        if src.dest == _CIFAR_DIR:
            expected = _cifar_bin_bytes()
            for member in src.members:
                size = (staging / member).stat().st_size
                if size != expected:
                    raise DataError(
                        f"{src.filename}: member {member} is {size} bytes, expected {expected}"
                    )
        written = []
        for member in src.members:
            final = directory / member
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / member, final)
            written.append(final)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def download(name: str, data_dir: str | Path, timeout: float = 60) -> list[Path]:
    """Fetch the files of ``name`` into ``data_dir``, verify them, and return what was written.

    Files already present and verified are skipped (the returned list is then empty). Every
    download goes to a temporary file, is checked against the published MD5 and only then
    renamed into place. Raises DataError on a checksum mismatch (nothing is left behind) or when
    no source can be reached (the message says where to put the files by hand).
    """
    root = Path(data_dir)
    meta = info(name)
    if not meta.files:
        return []  # bundled (digits) or generated (synthetic): nothing to fetch
    written: list[Path] = []
    for src in SOURCES[name]:
        if src.members:
            targets = [root / src.dest / m for m in src.members]
            if all(t.is_file() for t in targets) and _verified(name, root):
                _log.info("%s: already present and verified", name)
                continue
            archive = _download_verified(name, src, root, timeout)
            try:
                written += _extract_members(src, archive, root)
            finally:
                archive.unlink(missing_ok=True)
        else:
            final = root / src.dest / src.filename
            if final.is_file():
                if _md5(final) == src.md5:
                    _log.info("%s: already present and verified", final)
                    continue
                _log.info("%s: MD5 mismatch, downloading it again", final)
            tmp = _download_verified(name, src, root, timeout)
            os.replace(tmp, final)
            written.append(final)
    verify(name, root)
    return written


def _verified(name: str, root: Path) -> bool:
    try:
        verify(name, root)
    except DataError:
        return False
    return True


# --- loading -----------------------------------------------------------------------------------


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
        kind = "images" if magic == _IDX_IMAGES_MAGIC else "labels"
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
    image_path = root / _MNIST_DIR / names[0]
    label_path = root / _MNIST_DIR / names[1]
    images = _read_idx(image_path, _IDX_IMAGES_MAGIC, 3)
    if images.shape[1:] != meta.shape[1:]:
        raise DataError(
            f"{image_path}: images are {images.shape[1]}x{images.shape[2]}, "
            f"expected {meta.shape[1]}x{meta.shape[2]}"
        )
    labels = _read_idx(label_path, _IDX_LABELS_MAGIC, 1)
    if len(labels) != len(images):
        raise DataError(
            f"{image_path} holds {len(images)} images but {label_path} holds {len(labels)} "
            "labels; the files do not belong together"
        )
    _check_labels(label_path, labels, meta.num_classes)
    return images.reshape(len(images), *meta.shape), labels.astype(np.int64)


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


def _load_cifar10(root: Path, meta: DatasetInfo) -> Arrays:
    base = root / _CIFAR_DIR / _CIFAR_SUBDIR
    parts = [_read_cifar_bin(base / f) for f in _CIFAR_TRAIN]
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    test_x, test_y = _read_cifar_bin(base / _CIFAR_TEST)
    mean, std = _NORM["cifar10"]
    return Arrays(meta, train_x, train_y, test_x.copy(), test_y, 255.0, mean, std)


def _load_digits(meta: DatasetInfo) -> Arrays:
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
    return Arrays(meta, train_x, train_y, test_x, test_y, 16.0, mean, std)


def _synthetic(meta: DatasetInfo, seed: int, samples: int | None = None) -> Arrays:
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


def load(name: str, data_dir: str | Path, seed: int = 0, samples: int | None = None) -> Arrays:
    """Load ``name`` as uint8 arrays; ``seed`` and ``samples`` (training images to generate,
    None for the data set's own count) only drive synthetic data.

    Real files are trusted for their sample counts (so small test files work) but checked for
    consistency: magic numbers, header sizes against byte lengths, image/label counts, label
    range. Any problem raises DataError naming the file.
    """
    meta = info(name)
    root = Path(data_dir)
    if meta.synthetic:
        return _synthetic(meta, seed, samples)
    if name == "digits":
        return _load_digits(meta)
    if missing_files(name, root):
        raise DataError(missing_message(name, root))
    if name == "mnist":
        train_x, train_y = _load_mnist_split(root, _MNIST_TRAIN, meta)
        test_x, test_y = _load_mnist_split(root, _MNIST_TEST, meta)
        mean, std = _NORM["mnist"]
        return Arrays(meta, train_x, train_y, test_x, test_y, 255.0, mean, std)
    if name == "cifar10":
        return _load_cifar10(root, meta)
    raise AssertionError(f"no loader for {name!r}")  # pragma: no cover - DATASETS is closed


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``download`` or ``check`` a dataset; exit status 1 with the message on failure."""
    parser = argparse.ArgumentParser(
        prog="python -m trainscale.data", description="Fetch or check trainscale datasets."
    )
    parser.add_argument("command", choices=("download", "check"))
    parser.add_argument("name", choices=DATASETS)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--timeout", type=float, default=60, help="seconds per request")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "download":
            written = download(args.name, args.data_dir, timeout=args.timeout)
            for path in written:
                print(f"fetched {path}")
        else:
            verify(args.name, args.data_dir)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {args.name} is ready under {args.data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

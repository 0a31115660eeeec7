"""The data set catalogue: what each data set is, where its files live and where to fetch them.

Facts only, known without reading a file: shapes, class and sample counts, the files a study
needs under ``data_dir``, normalisation constants and the published download sources with their
MD5s. The Snakefile reads these at parse time (to list a study's files and stop before any job
starts), so this module imports nothing heavier than numpy (for the ``Arrays`` type).

Reading the files is ``trainscale.data.formats``; fetching and checking them is
``trainscale.data.fetch``; ``trainscale.data`` is the entry point that ties them together.
"""

from dataclasses import dataclass

import numpy as np

DATASETS: tuple[str, ...] = (
    "digits",
    "mnist",
    "cifar10",
    "synthetic-mnist",
    "synthetic-cifar10",
    "synthetic-imagenet",
    "synthetic-tokens",
    "shakespeare",
)
#: Built-in sets of token ids (DatasetInfo.input "tokens"); the rest hold images.
TOKEN_SETS: tuple[str, ...] = ("synthetic-tokens", "shakespeare")


class DataError(Exception):
    """Missing, corrupt or unreachable data; the message says which file and what to do."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset, known without reading any file. A token set's sample is
    a window of seq_len ids, a matrix axis: its `shape` is (seq_len,) once a run fixes it,
    () before; its classes are its vocabulary and its sample counts are token counts (window
    counts for synthetic-tokens, whose ids are made at the run's seq_len)."""

    name: str
    shape: tuple[int, ...]  # (C, H, W) of an image; (seq_len,) or () for tokens
    num_classes: int
    train_samples: int
    test_samples: int
    synthetic: bool
    files: tuple[str, ...]  # relative to data_dir; empty when nothing is read from disk
    input: str = "image"  # "image" or "tokens": what a model must eat (catalog Model.input)


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

MNIST_DIR = "mnist"
MNIST_TRAIN = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
MNIST_TEST = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte data, 3 dimensions
IDX_LABELS_MAGIC = 0x00000801  # unsigned byte data, 1 dimension

CIFAR_DIR = "cifar10"
CIFAR_SUBDIR = "cifar-10-batches-bin"  # the directory the official archive unpacks to
CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST = "test_batch.bin"
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
        tuple(f"{MNIST_DIR}/{f}" for f in (*MNIST_TRAIN, *MNIST_TEST)),
    ),
    "cifar10": DatasetInfo(
        "cifar10",
        (3, 32, 32),
        10,
        50_000,
        10_000,
        False,
        tuple(f"{CIFAR_DIR}/{CIFAR_SUBDIR}/{f}" for f in (*CIFAR_TRAIN, CIFAR_TEST)),
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
    # Random ids over GPT-2's vocabulary padded to a multiple of 64 (nanoGPT's 50,304), no
    # evaluation, like the images; kept small as synthetic-imagenet is: its counts are windows
    # (of any seq_len), 1280 = 10 batches of 128, 256 for the test split (`samples` sets them).
    "synthetic-tokens": DatasetInfo("synthetic-tokens", (), 50_304, 1280, 256, True, (), "tokens"),
    # The byte-level corpus that ships in the package (trainscale.data.tokens): 1,036,481
    # bytes of Shakespeare, the last tenth the validation split.
    "shakespeare": DatasetInfo("shakespeare", (), 256, 932_832, 103_649, False, (), "tokens"),
}

# Usual normalisation constants (of x / 255), as used by torchvision examples.
NORM: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
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
        Source(f, tuple(m + f for m in _MNIST_MIRRORS), _MNIST_MD5[f], MNIST_DIR)
        for f in (*MNIST_TRAIN, *MNIST_TEST)
    ),
    "cifar10": (
        Source(
            "cifar-10-binary.tar.gz",
            ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
            "c32a1d4ab5d03f1284b67883e8d87530",
            CIFAR_DIR,
            members=tuple(f"{CIFAR_SUBDIR}/{f}" for f in (*CIFAR_TRAIN, CIFAR_TEST)),
        ),
    ),
}


# --- missing files -----------------------------------------------------------------------------

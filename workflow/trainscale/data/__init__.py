"""Data: the data sets a study trains on. Built-in ones (this module loads them, on
`catalogue`, `fetch` and `formats`), the user's image folders and WebDataset shards with
their pre-flight checks and readers, and export. Imports no other trainscale stage.
"""

# Images stay uint8 (N, C, H, W) in memory (4x smaller than float32); a runner converts one
# batch at a time with x / x_max and the per-channel mean/std. This package imports numpy only
# at module level, on purpose: the Snakefile imports it at parse time (to list the files a study
# needs and fail before any job starts), and the PyTorch and TensorFlow runners share it, so it
# must not pull in either framework (the readers, `imagedata` and `imagedata_tf`, import theirs).
#
# Real files are parsed from their published binary formats (MNIST IDX, CIFAR-10 binary
# version). Nothing is ever unpickled, so a tampered data file cannot run code. `catalogue`
# holds the facts of every data set (shapes, files, sources, MD5s), `fetch` what is missing,
# fetching and verifying files, `formats` reading the published file formats into arrays.
#
# Command line (used by the `download` Snakemake rule):
#     python -m trainscale.data download <name> <data_dir>
#     python -m trainscale.data check <name> <data_dir>

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from trainscale.data.catalogue import (
    CIFAR_RECORD_BYTES,
    CIFAR_RECORDS_PER_FILE,
    DATASETS,
    SOURCES,
    TOKEN_SETS,
    Arrays,
    DataError,
    DatasetInfo,
    Source,
    info,
)
from trainscale.data.fetch import download, missing_files, missing_message, verify
from trainscale.data.formats import cifar10_arrays, digits_arrays, mnist_arrays, synthetic_arrays

__all__ = [
    "CIFAR_RECORD_BYTES",
    "CIFAR_RECORDS_PER_FILE",
    "DATASETS",
    "SOURCES",
    "TOKEN_SETS",
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


def load(name: str, data_dir: str | Path, seed: int = 0, samples: int | None = None) -> Arrays:
    """Load ``name`` as uint8 arrays; ``seed`` and ``samples`` (training images to generate,
    None for the data set's own count) only drive synthetic data.

    Real files are trusted for their sample counts (so small test files work) but checked for
    consistency: magic numbers, header sizes against byte lengths, image/label counts, label
    range. Any problem raises DataError naming the file.
    """
    meta = info(name)
    if meta.input == "tokens":
        raise ValueError(f"{name} holds token ids: trainscale.data.tokens reads it, not load()")
    root = Path(data_dir)
    if meta.synthetic:
        return synthetic_arrays(meta, seed, samples)
    if name == "digits":
        return digits_arrays(meta)
    if missing_files(name, root):
        raise DataError(missing_message(name, root))
    if name == "mnist":
        return mnist_arrays(root, meta)
    if name == "cifar10":
        return cifar10_arrays(root, meta)
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

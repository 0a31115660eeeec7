"""Token data sets in a study: the built-in ones (`synthetic-tokens`, `shakespeare`) and the
user's (config `datasets: {NAME: {format: tokens, train, test, vocab_size, dtype, header}}`),
what they are and whether they can be trained on, known before any job starts.

A token set's sample is a window of `seq_len` ids (the matrix axis), so its facts depend on
the cell: `info` gives the shape (seq_len,) and the vocabulary as the classes; `short` says
when a cell's ranks would not each get one full batch. Imports numpy only (the Snakefile
imports it at parse time).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from trainscale import data
from trainscale.data import tokens

FORMAT = "tokens"
#: keys a token entry of `datasets:` may have
KEYS = frozenset({"format", "train", "test", "vocab_size", "dtype", "header"})
REQUIRED = ("train", "test", "vocab_size")


def is_tokens(name: str, datasets: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether `matrix.dataset` name `name` holds token ids (a built-in token set or a
    `format: tokens` entry of config `datasets`)."""
    if name in data.DATASETS:
        return data.info(name).input == "tokens"
    entry = datasets.get(name) or {}
    return entry.get("format") == FORMAT


def source_of(name: str, datasets: Mapping[str, Mapping[str, Any]]) -> tokens.TokenSource | None:
    """The frozen TokenSource of a user token set of config `datasets` (paths made absolute,
    from the directory Snakemake runs in), or None for a built-in one."""
    entry = datasets.get(name)
    if name in data.DATASETS or entry is None:
        return None
    return tokens.TokenSource.from_dict(
        {**entry, "train": os.path.abspath(entry["train"]), "test": os.path.abspath(entry["test"])}
    )


def info(name: str, source: tokens.TokenSource | None, seq_len: int = 0) -> data.DatasetInfo:
    """data.info of a token set: shape (seq_len,) (() when 0), the vocabulary as its classes,
    token counts as its sample counts (a user file's read from its size and header)."""
    shape = (seq_len,) if seq_len else ()
    if source is None:
        return dataclasses.replace(data.info(name), shape=shape)
    counts = [source.split(s).tokens for s in ("train", "test")]
    return data.DatasetInfo(name, shape, source.vocab_size, *counts, False, (), FORMAT)


def short(name: str, info: data.DatasetInfo, seq_len: int, ranks: int, batch: int) -> str | None:
    """Why `ranks` ranks of `batch` windows of `seq_len` ids cannot each train one full batch
    on the split (`info` from `info`), or None when they can."""
    windows = tokens.window_count(info.train_samples, seq_len)
    if windows >= ranks * batch:
        return None
    return (
        f"{name} holds {info.train_samples} training tokens, {windows} windows of seq_len "
        f"{seq_len}: fewer than one batch of {batch} for each of {ranks} ranks "
        f"({ranks * batch * seq_len + 1} tokens); use fewer workers, a smaller batch_size or "
        "seq_len, or more tokens"
    )


def problems(name: str, entry: dict, key: str, check_files: bool) -> list[str]:
    """Problems of one `format: tokens` entry of `datasets:`: keys missing or not allowed,
    and (`check_files`: the study trains on it) each file's existence, size, header and the
    largest id in a sample against vocab_size."""
    extra = sorted(set(entry) - KEYS)
    missing = [k for k in REQUIRED if k not in entry]
    if extra or missing:
        what = []
        if missing:
            what.append(f"missing {', '.join(missing)}")
        if extra:
            what.append(f"{', '.join(extra)} not allowed (image keys?)")
        return [
            f"{key}: {'; '.join(what)}; a token data set needs format: tokens, train and test "
            "(token files: nanoGPT .bin or llm.c shards) and vocab_size, with dtype and header "
            "optional; docs/data.md"
        ]
    if not check_files:
        return []
    out = []
    for split in ("train", "test"):
        where = f"{key}.{split}"
        try:
            found = tokens.open_tokens(
                os.path.abspath(entry[split]), entry.get("dtype", "uint16"), entry.get("header"),
                where,
            )  # fmt: skip
        except tokens.TokenDataError as e:
            out.append(str(e))
            continue
        out.extend(tokens.check(found, entry["vocab_size"], where, f"{key}.vocab_size"))
    return out

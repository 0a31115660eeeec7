"""Whether a cell's data can feed every one of its ranks a full batch, decided before any job.

A cell whose data gives some rank no full batch would start, and fail in every rank (the
loaders' ImageDataError, the token loader's error) or time fewer steps than its neighbours.
This module is the one place that decides it at parse time, with the loaders' own tests
(imagesets.short_of_shards, tokensets.short), so `snakemake -n` already says so:

- the user's files (a WebDataset's shards, a token file) too small for a cell stop the study
  with a ConfigError naming `datasets.NAME.train`, the count that is short, the cell and the
  fix. They are not dropped: a cell the user asked for of data the user supplied never goes
  missing quietly, and the message names the cell, so matrix.exclude or a smaller workers list
  resolves it;
- a built-in data set too small for a cell (a short token corpus, too few samples for
  `steps_per_epoch`) drops the cell with the reason, as other impossible combinations are.
"""

from __future__ import annotations

from trainscale import data
from trainscale.data import imagesets, tokensets
from trainscale.plan import catalog
from trainscale.plan.runspec import ConfigError
from trainscale.plan.studyconfig import StudyConfig


def short_of_tokens(values: dict, info: data.DatasetInfo, replicas: int, batch: int) -> str | None:
    """Why the cell's `replicas` (catalog.data_replicas) do not each get one full batch of
    windows of a token file (a dropped cell's reason for a built-in set); for the user's files
    a ConfigError naming the key, before any job."""
    reason = tokensets.short(values["dataset"], info, values["seq_len"], replicas, batch)
    if reason and values["dataset"] not in data.DATASETS:
        raise ConfigError(f"datasets.{values['dataset']}.train: {reason} ({_cell(values)})")
    return reason


def _cell(values: dict) -> str:
    """The cell a pre-flight error is about, as matrix.exclude would name it."""
    keys = ["strategy", "workers", "nodes", "batch_size"] + ["seq_len"] * bool(values["seq_len"])
    return "cell " + ", ".join(f"{k}={values[k]}" for k in keys)


def check_shards(values: dict, study: StudyConfig, replicas: int, gbs: int, pwbs: int) -> None:
    """A ConfigError, before any job, where a WebDataset's train shards give some rank of the
    cell no full batch (imagesets.short_of_shards, the loaders' own test). It stops the study
    rather than dropping the cell, as a token file too small does (short_of_tokens): both are
    the user's files, and a cell the user asked for never goes missing quietly; the message
    names the cell, so matrix.exclude or a smaller workers list resolves it."""
    entry = study.datasets.get(values["dataset"]) or {}
    if entry.get("format") != "webdataset" or values["dataset"] in data.DATASETS:
        return
    strategy = catalog.STRATEGIES[values["strategy"]]
    loaders = study.loader_workers if strategy.runtime == "torch" else 0  # tf.data
    if values["strategy"] == "torch-pipeline" or (
        strategy.runtime == "tensorflow" and strategy.framework != "horovod"
    ):  # one reader of global batches (a pipeline's stages, a tf.distribute process)
        ranks, batch = 1, gbs
    else:  # every replica reads its own shards (torch's ranks or tp groups, Horovod's Keras)
        ranks, batch = replicas, pwbs
    why = imagesets.short_of_shards(entry["train"], ranks, loaders, batch)
    if why:
        raise ConfigError(
            f"datasets.{values['dataset']}.train: {why} ({_cell(values)}); or leave the cell "
            "out with matrix.exclude"
        )


def too_few_steps(
    values: dict, samples: int, replicas: int, per_worker_batch: int, limit: int | None
) -> str | None:
    """Why a cell cannot run `steps_per_epoch` steps per epoch (its data set, scaled, has fewer
    batches over its `replicas`), or None. A cell that ran fewer steps than the others would
    time something else."""
    if limit is None:
        return None
    full = samples * values["scale"] // replicas // per_worker_batch
    if full >= limit:
        return None
    return (
        f"steps_per_epoch {limit} is more than the {full} steps one epoch of "
        f"{values['dataset']} has at this batch (raise scale or samples, or lower steps_per_epoch)"
    )

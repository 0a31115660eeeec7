"""The experiment matrix: config -> frozen run specifications, and the checks of a config.

`build_runs` is a pure function of the (schema-validated) config; each `RunSpec`
(trainscale.plan.runspec) it returns is what a run is. Which combinations cannot run is the
catalog's to say (`catalog.why_not`); this module adds what only the whole config knows: batch
splits, exclusions, faults (plan.faults), steps per epoch. `trainscale check CONFIG` checks config
files without running anything. This module imports neither torch nor TensorFlow, so the
Snakefile stays fast.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

from trainscale import data
from trainscale.data import imagesets, tokens, tokensets
from trainscale.plan import (
    catalog,
    cluster,
    datafit,
    exclusions,
    faults,
    knobs,
    speed_options,
)
from trainscale.plan.preflight import hf_models, own_models
from trainscale.plan.runspec import (
    DIVERGE_LR,
    MATRIX_KEYS,
    OUT_OF_PATH,
    ConfigError,
    Dropped,
    RunSpec,
)

#: Tokens per window when matrix.seq_len is not given (the schema's default).
DEFAULT_SEQ_LEN = 256

#: Strategies this version can run: those with a runner.
IMPLEMENTED: frozenset[str] = frozenset(s.name for s in catalog.STRATEGIES.values() if s.runner)


def repeat_range(repeats: int | dict) -> tuple[int, int]:
    """(min, max) of config `repeats` (an integer n is (n, n)): every cell runs `min`
    repeats, and a cell the racing step asks for gets more, up to `max` (docs/tune.md,
    "Repeats a study buys"); ConfigError where max < min."""
    if isinstance(repeats, int):
        return repeats, repeats
    low, high = repeats["min"], repeats["max"]
    if high < low:
        raise ConfigError(f"repeats: max {high} is below min {low}; give max >= min")
    return low, high


def repeat_count(repeats: int | dict) -> int:
    """The repeats every cell of a study runs (config `repeats`' min)."""
    return repeat_range(repeats)[0]


def effective_lr(lr: float, scaling: str, global_batch: int, base_batch: int) -> float:
    """Learning rate after the configured batch-size scaling rule."""
    if scaling == "linear":
        return lr * global_batch / base_batch
    if scaling == "sqrt":
        return lr * math.sqrt(global_batch / base_batch)
    return lr


def why_not(
    values: dict,
    accelerator: str,
    microbatches: int = 1,
    schedule: str = "gpipe",
    info: data.DatasetInfo | None = None,
    own: own_models.OwnModel | None = None,
    gpus_per_node: int | None = None,
) -> str | None:
    """The reason a strategy or model cannot do this combination, or None if it can."""
    info = info or data.info(values["dataset"])
    shape, image = info.shape, info.input == "image"
    builtin = values["dataset"] in data.DATASETS
    cell = catalog.Cell(
        **{k: values[k] for k in ("strategy", "model", "dataset", "workers", "nodes")},
        **{k: values[k] for k in ("batch_size", "batch_mode", "precision")},
        accelerator=accelerator,
        microbatches=microbatches,
        schedule=schedule,
        input_side=min(shape[1], shape[2]) if image else 0,
        data_input=info.input,
        user_data=not builtin and image,
        resized=builtin and image and tuple(shape) != tuple(data.info(values["dataset"]).shape),
        own=own.row() if own else None,
        tp=values["tp"],
        seq_len=values["seq_len"],
        classes=info.num_classes,
        gpus_per_node=gpus_per_node,
    )
    runtime = catalog.STRATEGIES[values["strategy"]].runtime
    if own is not None and own.torch == hf_models.BUILDER:
        hf = own.builder_kwargs
        return (hf_models.framework_why_not(values["strategy"], runtime, hf)
                or catalog.why_not(cell) or hf_models.shape_why_not(values, hf))  # fmt: skip
    if own is not None and runtime == "tensorflow" and own.keras is None:
        return (
            f"{values['strategy']}: {own.name} has no Keras twin (models.{own.name}.keras): "
            "the TensorFlow strategies train a Keras model"
        )
    return catalog.why_not(cell)


pipeline_batch = catalog.pipeline_batch


def _split_batch(values: dict, world: int) -> tuple[int, int]:
    """(global, per-worker) batch of a cell: the pipeline's and tensor parallelism's own splits
    (catalog.pipeline_batch, catalog.tp_batch), else `batch_sizes`."""
    strategy, size, mode = values["strategy"], values["batch_size"], values["batch_mode"]
    if strategy == "torch-pipeline":
        return pipeline_batch(size, mode, world)
    if strategy not in catalog.TENSOR_PARALLEL:
        return batch_sizes(size, mode, world)
    try:
        return catalog.tp_batch(size, mode, world, values["tp"])
    except ValueError:
        replicas = world // values["tp"]
        raise ConfigError(
            f"matrix.batch_size {size} in batch_mode 'global' does not split over the "
            f"{replicas} data-parallel replicas of {strategy} at tp {values['tp']} on {world} "
            f"workers; choose a multiple of {replicas} or exclude the cell"
        ) from None


def batch_sizes(batch_size: int, mode: str, world: int) -> tuple[int, int]:
    """(global, per-worker) batch for a batch mode; raises ConfigError if it does not split."""
    if mode == "per_worker":
        return batch_size * world, batch_size
    if batch_size % world:
        raise ConfigError(
            f"matrix.batch_size {batch_size} in batch_mode 'global' does not split over "
            f"{world} workers (workers × nodes); choose a multiple of {world} or add "
            f"'exclude: [{{batch_size: {batch_size}, workers: …}}]' to matrix"
        )
    return batch_size, batch_size // world


def build_runs(
    config: dict, accelerator: str = "cpu", gpus_per_node: int | None = None
) -> tuple[list[RunSpec], list[Dropped]]:
    """Expand a validated config into run specs (cartesian product minus exclusions).

    `accelerator` is "cpu" or "cuda": what the workers will run on, used to drop
    combinations that cannot be parallel there (e.g. DataParallel without GPUs), and each
    run's `accelerator` (`train_on`): on "cuda" a rank without a GPU fails its run.
    `gpus_per_node`: the GPUs the ranks of a node will have, where known (a study run on this
    machine: `visible_gpus()`); cells whose ranks would share one where they must not are
    dropped. None: each worker gets a GPU of its own (a cluster's request).
    """
    try:
        config = hf_models.expand(config)  # hf:NAME: an own model of a safe name
    except hf_models.HFConfigError as e:
        raise ConfigError(str(e)) from None
    m = config["matrix"]
    not_yet = [s for s in m["strategy"] if s not in IMPLEMENTED]
    if not_yet:
        raise ConfigError(
            f"matrix.strategy: {', '.join(not_yet)} not implemented in this version of trainscale "
            f"(available: {', '.join(sorted(IMPLEMENTED))}); remove it from matrix.strategy"
        )
    opt = config["optimizer"]
    ds_fragment = config.get("deepspeed_config")
    uses_deepspeed = any(catalog.strategy(s).framework == "deepspeed" for s in m["strategy"])
    if uses_deepspeed and ds_fragment and not Path(ds_fragment).is_file():
        raise ConfigError(
            f"deepspeed_config: {ds_fragment} does not exist; give the path of a DeepSpeed "
            "config fragment (JSON or YAML), relative to the directory Snakemake runs in, or "
            "remove the key"
        )
    runs: list[RunSpec] = []
    dropped: list[Dropped] = []
    axes = {**{k: [v] for k, v in OUT_OF_PATH.items()}, **speed_options.axes(config), **m,
            "seq_len": m.get("seq_len") or [DEFAULT_SEQ_LEN]}  # fmt: skip
    token_sets = {n: tokensets.is_tokens(n, config) for n in m["dataset"]}
    left = exclusions.pairs_left(axes, m.get("exclude", []), token_sets)  # checked: these
    vocab = {n: _info({"dataset": n, "seq_len": axes["seq_len"][0]}, config).num_classes
             for n, is_tokens in token_sets.items() if is_tokens}  # fmt: skip
    too_small = hf_models.vocabulary_problems(config, vocab, left)
    if too_small:
        raise ConfigError("; ".join(too_small))
    answer = own_models.check(config, data_shapes(config, axes["seq_len"]))
    if own_models.problems(answer):
        raise ConfigError("; ".join(own_models.problems(answer)))
    infos: dict[tuple, data.DatasetInfo] = {}  # per data set and seq_len: files read once
    for combo in itertools.product(*(axes[k] for k in MATRIX_KEYS)):
        values = dict(zip(MATRIX_KEYS, combo, strict=True))
        if not token_sets[values["dataset"]]:  # images: no seq_len, one cell for all its values
            if values["seq_len"] != axes["seq_len"][0]:
                continue
            values["seq_len"] = 0
        if exclusions.excluded(values, m.get("exclude", [])):
            dropped.append(Dropped(values, "excluded by matrix.exclude"))
            continue
        pipe = values["strategy"] == "torch-pipeline"
        mb, schedule = config.get("microbatches", 4), config.get("pipeline_schedule", "gpipe")
        if pipe:  # its schedule accumulates: grad_accum × microbatches micro-batches a step
            mb *= values["grad_accum"]
        key = (values["dataset"], values["seq_len"])
        if key not in infos:
            infos[key] = _info(values, config)
        info = infos[key]
        own = None
        if values["model"] in answer:
            own = own_models.frozen(values["model"], config, answer, info.shape, info.num_classes)
        reason = (
            why_not(values, accelerator, mb, schedule, info, own, gpus_per_node)
            or cluster.why_not(values, config, accelerator)
            or speed_options.why_not(values["strategy"], values["model"],
                                     values["memory_format"], values["compile"], own,
                                     values["grad_accum"])
            or knobs.why_not(values["strategy"], values["model"],
                             values["activation_checkpointing"], values["offload"],
                             opt["name"], own)
        )  # fmt: skip
        if reason:
            dropped.append(Dropped(values, reason))
            continue
        world = values["workers"] * values["nodes"]
        gbs, pwbs = _split_batch(values, world)
        replicas = catalog.data_replicas(values["strategy"], world, values["tp"])
        if pwbs < 2 and (own.row() if own else catalog.MODELS[values["model"]]).batchnorm:
            reason = f"{values['model']} has BatchNorm: needs at least 2 samples per worker"
            dropped.append(Dropped(values, reason))
            continue
        samples = config.get("samples") if info.synthetic else None
        limit = config.get("steps_per_epoch")
        have = samples or info.train_samples
        if values["seq_len"] and not info.synthetic:  # a token file: windows of seq_len ids
            have = tokens.window_count(info.train_samples, values["seq_len"])
            reason = datafit.short_of_tokens(values, info, replicas, pwbs)
        reason = reason or datafit.too_few_steps(values, have, replicas, pwbs, limit)
        if reason:
            dropped.append(Dropped(values, reason))
            continue
        datafit.check_shards(values, config, replicas, gbs, pwbs)
        lr = effective_lr(opt["lr"], config["lr_scaling"], gbs, config["base_batch_size"])
        framework = catalog.STRATEGIES[values["strategy"]].framework
        is_ds = framework == "deepspeed"
        grad_accum = values["grad_accum"]
        if pwbs % grad_accum:
            raise ConfigError(
                f"grad_accum {grad_accum} does not divide the per-worker batch {pwbs} of "
                f"{values['strategy']} with batch_size {values['batch_size']} on {world} "
                "workers; choose a grad_accum that divides it or exclude the cell"
            )
        # every field but the repeat's own, once per cell (a large study has thousands of runs)
        cell = dict(
            study=config["study"],
            **values,
            epochs=config["epochs"],
            optimizer=opt["name"],
            lr=lr,
            base_lr=opt["lr"],
            lr_scaling=config["lr_scaling"],
            betas=tuple(opt["betas"]),
            eps=opt["eps"],
            weight_decay=opt["weight_decay"],
            momentum=opt["momentum"],
            fused=opt["fused"],
            global_batch_size=gbs,
            per_worker_batch_size=pwbs,
            world_size=world,
            threads_per_worker=config["threads_per_worker"],
            timeout_minutes=config["timeout_minutes"],
            target_accuracy=config.get("target_accuracy"),
            data_dir=config["data_dir"],
            deepspeed_config=ds_fragment if is_ds else None,
            horovod_timeline=config.get("horovod_timeline", False) and framework == "horovod",
            pipeline_schedule=schedule if pipe else None,
            microbatches=mb if pipe else 1,
            steps_per_epoch=limit,
            eval_tokens=config.get("eval_tokens", tokens.EVAL_TOKENS),
            samples=samples,
            ps_tasks=config.get("ps_tasks", 1) if values["strategy"] == "tf-ps" else 0,
            own_model=own,
            accelerator=train_on(accelerator, config),
            **imagesets.run_fields(values["dataset"], config),
        )
        planted_faults = config.get("faults", [])
        # every repeat a cell may run: the racing step asks those past min (common.smk)
        for repeat in range(repeat_range(config["repeats"])[1]):
            fault = faults.fault_for(values, repeat, planted_faults)
            planted = {"lr": DIVERGE_LR} if fault and fault.kind == "diverge" else {}
            runs.append(
                RunSpec(
                    **{**cell, **planted},
                    repeat=repeat,
                    seed=config["seed"] + repeat,
                    fault=fault,
                )
            )
    if not runs:
        raise ConfigError(
            "the matrix is empty after exclusions and impossible combinations: "
            + summary(runs, dropped)
            + "; widen matrix or shorten matrix.exclude"
        )
    faults.check(config.get("faults", []), runs)
    return runs, dropped


def train_on(accelerator: str, config: dict) -> str:
    """The device a study's ranks must train on: its accelerator, but the CPU where config
    `slurm.fake_gpus` says the cluster's GPUs are gres entries with no device behind them
    (a test cluster: jobs ask for GPUs as on a GPU cluster, ranks train on the CPU)."""
    fake = (config.get("slurm") or {}).get("fake_gpus", False)
    return "cpu" if fake else accelerator


def data_shapes(config: dict, seq_lens: list[int]) -> dict[str, list[tuple]]:
    """(shape, classes) each own model of the matrix is built at by its pre-flight: the data
    sets of its kind (a token set at each seq_len) with which matrix.exclude leaves it a cell
    (trainscale.plan.exclusions); {} where the study has no own models."""
    own = own_models.names(config)
    if not own:
        return {}
    m = config["matrix"]
    tokens = {name: tokensets.is_tokens(name, config) for name in m["dataset"]}
    axes = {**{k: [v] for k, v in OUT_OF_PATH.items()}, **m, "seq_len": seq_lens}
    left = exclusions.pairs_left({**axes, "model": own}, m.get("exclude") or [], tokens)
    infos = {(d, t): _info({"dataset": d, "seq_len": t}, config) for _, d, t in left}
    out: dict[str, list[tuple]] = {}
    for model, dataset, t in sorted(left):
        kind = "tokens" if tokens[dataset] else "image"
        if kind == (config["models"][model].get("input") or "image"):
            info = infos[(dataset, t)]
            out.setdefault(model, []).append((info.shape, info.num_classes))
    return out


def _info(values: dict, config: dict) -> data.DatasetInfo:
    """data.info of the cell's data set: a token set's at the cell's seq_len."""
    name = values["dataset"]
    if values["seq_len"]:
        return tokensets.info(name, tokensets.source_of(name, config), values["seq_len"])
    return imagesets.info(name, config)


def summary(runs: list[RunSpec], dropped: list[Dropped]) -> str:
    """One line: how many runs, and how many combinations were dropped for which reason."""
    line = f"{len(runs)} runs"
    if dropped:
        reasons = Counter(d.reason for d in dropped)
        parts = "; ".join(f"{n} × {r}" for r, n in reasons.most_common())
        line += f", {len(dropped)} combinations dropped ({parts})"
    return line


def study_summary(runs: list[RunSpec], dropped: list[Dropped], repeats: int | dict) -> str:
    """`summary` of the runs every cell makes (config `repeats`' min), and with {min, max}
    the most the racing step may add."""
    low, high = repeat_range(repeats)
    line = summary([r for r in runs if r.repeat < low], dropped)
    if high > low:
        line += (f"; up to {len(runs)} runs with the repeats the race may add (repeats {low} "
                 f"to {high} a cell)")  # fmt: skip
    return line


CONFIG_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"

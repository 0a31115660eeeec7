"""The experiment matrix: config -> frozen run specifications, and the checks of a config.

`build_runs` is a pure function of the (schema-validated) config; each `RunSpec`
(trainscale.plan.runspec) it returns is what a run is. It reads as its steps: the study's
`matrix_context` (the checks that stop the whole study, the axes, the own models' facts), then
for each of the `combos` its `drop_reason` (plan.combination: the catalog's rules and what only
the whole config knows: batch splits, exclusions, steps per epoch) or its `fields` and its
`repeats` (faults planted: plan.faults). `trainscale check CONFIG` checks config files without
running anything. This module imports neither torch nor TensorFlow, so the Snakefile stays
fast.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trainscale.data import imagesets, tokensets
from trainscale.plan import catalog, datafit, exclusions, faults, speed_options, studyconfig
from trainscale.plan.combination import (
    BatchSplit,
    MatrixContext,
    dataset_info,
    drop_reason,
    pipeline_steps,
)
from trainscale.plan.preflight import hf_models, own_models
from trainscale.plan.runspec import (
    DIVERGE_LR,
    MATRIX_KEYS,
    OUT_OF_PATH,
    CellValues,
    ConfigError,
    Dropped,
    RunSpec,
)
from trainscale.plan.studyconfig import Repeats, StudyConfig, thawed

#: Tokens per window when matrix.seq_len is not given (the schema's default).
DEFAULT_SEQ_LEN = 256

#: Strategies this version can run: those with a runner.
IMPLEMENTED: frozenset[str] = frozenset(s.name for s in catalog.STRATEGIES.values() if s.runner)


def repeat_range(repeats: int | Mapping[str, int]) -> tuple[int, int]:
    """(min, max) of config `repeats` (an integer n is (n, n)): every cell runs `min`
    repeats, and a cell the racing step asks for gets more, up to `max` (docs/tune.md,
    "Repeats a study buys"); ConfigError where max < min."""
    parsed = Repeats.parse(repeats)
    return parsed.min, parsed.max


def repeat_count(repeats: int | Mapping[str, int]) -> int:
    """The repeats every cell of a study runs (config `repeats`' min)."""
    return repeat_range(repeats)[0]


def effective_lr(lr: float, scaling: str, global_batch: int, base_batch: int) -> float:
    """Learning rate after the configured batch-size scaling rule."""
    if scaling == "linear":
        return lr * global_batch / base_batch
    if scaling == "sqrt":
        return lr * math.sqrt(global_batch / base_batch)
    return lr


def build_runs(
    config: StudyConfig | Mapping[str, Any],
    accelerator: str = "cpu",
    gpus_per_node: int | None = None,
) -> tuple[list[RunSpec], list[Dropped]]:
    """Expand a validated config into run specs (cartesian product minus exclusions); a dict
    (tests, benchmarks) is read as `StudyConfig.from_filled` reads it.

    `accelerator` is "cpu" or "cuda": what the workers will run on, used to drop
    combinations that cannot be parallel there (e.g. DataParallel without GPUs), and each
    run's `accelerator` (`train_on`): on "cuda" a rank without a GPU fails its run.
    `gpus_per_node`: the GPUs the ranks of a node will have, where known (a study run on this
    machine: `visible_gpus()`); cells whose ranks would share one where they must not are
    dropped. None: each worker gets a GPU of its own (a cluster's request).
    """
    study = config if isinstance(config, StudyConfig) else StudyConfig.from_filled(config)
    ctx = matrix_context(study, accelerator, gpus_per_node)
    runs: list[RunSpec] = []
    dropped: list[Dropped] = []
    for values in combos(ctx.axes, ctx.token_sets):
        if why := drop_reason(values, ctx):
            dropped.append(Dropped(values, why))
            continue
        runs += repeats(fields(values, ctx), values, ctx)
    if not runs:
        raise ConfigError(
            "the matrix is empty after exclusions and impossible combinations: "
            + summary(runs, dropped)
            + "; widen matrix or shorten matrix.exclude"
        )
    faults.check(thawed(ctx.study.faults), runs)
    return runs, dropped


def matrix_context(
    study: StudyConfig, accelerator: str, gpus_per_node: int | None
) -> MatrixContext:
    """The study's axes and its own models' facts, after the checks that stop the whole study:
    strategies not implemented, a DeepSpeed fragment missing, vocabularies too small, own
    models that do not build (ConfigError naming the key and the fix)."""
    try:
        study = hf_models.expand(study)  # hf:NAME: an own model of a safe name
    except hf_models.HFConfigError as e:
        raise ConfigError(str(e)) from None
    matrix = thawed(study.matrix)
    _check_strategies(matrix["strategy"], study.deepspeed_config)
    seq_lens = matrix.get("seq_len") or [DEFAULT_SEQ_LEN]
    axes = {**{k: [v] for k, v in OUT_OF_PATH.items()}, **speed_options.axes(study), **matrix,
            "seq_len": seq_lens}  # fmt: skip
    token_sets = {name: tokensets.is_tokens(name, study.datasets) for name in matrix["dataset"]}
    left = exclusions.pairs_left(axes, matrix.get("exclude", []), token_sets)  # checked: these
    vocab = {name: dataset_info({"dataset": name, "seq_len": seq_lens[0]}, study).num_classes
             for name, is_tokens in token_sets.items() if is_tokens}  # fmt: skip
    too_small = hf_models.vocabulary_problems(study, vocab, left)
    if too_small:
        raise ConfigError("; ".join(too_small))
    own_facts = own_models.check(study, data_shapes(study, seq_lens))
    if own_models.problems(own_facts):
        raise ConfigError("; ".join(own_models.problems(own_facts)))
    return MatrixContext(
        study=study,
        accelerator=accelerator,
        gpus_per_node=gpus_per_node,
        axes=axes,
        exclude=matrix.get("exclude", []),
        token_sets=token_sets,
        own_facts=own_facts,
    )


def _check_strategies(strategies: list[str], fragment: str | None) -> None:
    """ConfigError where matrix.strategy names one this version cannot run, or a DeepSpeed
    strategy's config fragment (config `deepspeed_config`) does not exist."""
    not_yet = [s for s in strategies if s not in IMPLEMENTED]
    if not_yet:
        raise ConfigError(
            f"matrix.strategy: {', '.join(not_yet)} not implemented in this version of trainscale "
            f"(available: {', '.join(sorted(IMPLEMENTED))}); remove it from matrix.strategy"
        )
    uses_deepspeed = any(catalog.strategy(s).framework == "deepspeed" for s in strategies)
    if uses_deepspeed and fragment and not Path(fragment).is_file():
        raise ConfigError(
            f"deepspeed_config: {fragment} does not exist; give the path of a DeepSpeed "
            "config fragment (JSON or YAML), relative to the directory Snakemake runs in, or "
            "remove the key"
        )


def combos(axes: dict[str, list], token_sets: dict[str, bool]) -> Iterator[CellValues]:
    """Every combination of the axes' values, as {matrix key: value}, in MATRIX_KEYS order; an
    image data set has no seq_len: one combination at seq_len 0 for all of the axis' values."""
    for combo in itertools.product(*(axes[k] for k in MATRIX_KEYS)):
        values = dict(zip(MATRIX_KEYS, combo, strict=True))
        if not token_sets[values["dataset"]]:
            if values["seq_len"] != axes["seq_len"][0]:
                continue
            values["seq_len"] = 0
        yield values


def fields(values: CellValues, ctx: MatrixContext) -> dict[str, Any]:
    """Every RunSpec field of a combination that runs but its repeat's own (repeat, seed,
    fault), made once per combination (a large study has thousands of runs); ConfigError
    where its shards or its grad_accum do not divide its batch."""
    study, split = ctx.study, checked_split(values, ctx)
    framework = catalog.STRATEGIES[values["strategy"]].framework
    pipe = values["strategy"] == "torch-pipeline"
    microbatches, schedule = pipeline_steps(values, study)
    return dict(
        study=study.study,
        **values,
        **optimizer_fields(study, split.global_batch),
        global_batch_size=split.global_batch,
        per_worker_batch_size=split.per_worker_batch,
        world_size=split.world,
        epochs=study.epochs,
        threads_per_worker=study.threads_per_worker,
        timeout_minutes=study.timeout_minutes,
        target_accuracy=study.target_accuracy,
        data_dir=study.data_dir,
        deepspeed_config=study.deepspeed_config if framework == "deepspeed" else None,
        horovod_timeline=study.horovod_timeline and framework == "horovod",
        pipeline_schedule=schedule if pipe else None,
        microbatches=microbatches if pipe else 1,
        steps_per_epoch=study.steps_per_epoch,
        eval_tokens=study.eval_tokens,
        samples=study.samples if ctx.info(values).synthetic else None,
        ps_tasks=study.ps_tasks if values["strategy"] == "tf-ps" else 0,
        own_model=ctx.own_model(values),
        accelerator=train_on(ctx.accelerator, study.slurm),
        **imagesets.run_fields(values["dataset"], study.datasets, study.loader_workers),
    )


def checked_split(values: CellValues, ctx: MatrixContext) -> BatchSplit:
    """The combination's batch split; ConfigError where a WebDataset's shards give a rank no
    full batch (plan.datafit) or grad_accum does not divide the per-worker batch."""
    split = BatchSplit.of(values)
    datafit.check_shards(
        values, ctx.study, split.replicas, split.global_batch, split.per_worker_batch
    )
    if split.per_worker_batch % values["grad_accum"]:
        raise ConfigError(
            f"grad_accum {values['grad_accum']} does not divide the per-worker batch "
            f"{split.per_worker_batch} of {values['strategy']} with batch_size "
            f"{values['batch_size']} on {split.world} workers; choose a grad_accum that "
            "divides it or exclude the cell"
        )
    return split


def optimizer_fields(study: StudyConfig, global_batch: int) -> dict[str, Any]:
    """The RunSpec's optimizer fields: config `optimizer`, its lr scaled to the global batch
    by lr_scaling."""
    optimizer = study.optimizer
    return dict(
        optimizer=optimizer.name,
        lr=effective_lr(optimizer.lr, study.lr_scaling, global_batch, study.base_batch_size),
        base_lr=optimizer.lr,
        lr_scaling=study.lr_scaling,
        betas=optimizer.betas,
        eps=optimizer.eps,
        weight_decay=optimizer.weight_decay,
        momentum=optimizer.momentum,
        fused=optimizer.fused,
    )


def repeats(spec_fields: dict[str, Any], values: CellValues, ctx: MatrixContext) -> list[RunSpec]:
    """Every repeat a combination may run (config `repeats`' max: the racing step asks for
    those past min, common.smk), each with its seed and the fault planted in it, if any."""
    planted_faults = thawed(ctx.study.faults)
    runs = []
    for repeat in range(ctx.study.repeats.max):
        fault = faults.fault_for(values, repeat, planted_faults)
        planted = {"lr": DIVERGE_LR} if fault and fault.kind == "diverge" else {}
        runs.append(
            RunSpec(
                **{**spec_fields, **planted},
                repeat=repeat,
                seed=ctx.study.seed + repeat,
                fault=fault,
            )
        )
    return runs


def train_on(accelerator: str, slurm: Mapping[str, Any] | None) -> str:
    """The device a study's ranks must train on: its accelerator, but the CPU where config
    `slurm.fake_gpus` says the cluster's GPUs are gres entries with no device behind them
    (a test cluster: jobs ask for GPUs as on a GPU cluster, ranks train on the CPU)."""
    fake = (slurm or {}).get("fake_gpus", False)
    return "cpu" if fake else accelerator


def data_shapes(study: StudyConfig, seq_lens: list[int]) -> dict[str, list[tuple]]:
    """(shape, classes) each own model of the matrix is built at by its pre-flight: the data
    sets of its kind (a token set at each seq_len) with which matrix.exclude leaves it a cell
    (trainscale.plan.exclusions); {} where the study has no own models."""
    own = own_models.names(study)
    if not own:
        return {}
    m = thawed(study.matrix)
    tokens = {name: tokensets.is_tokens(name, study.datasets) for name in m["dataset"]}
    axes = {**{k: [v] for k, v in OUT_OF_PATH.items()}, **m, "seq_len": seq_lens}
    left = exclusions.pairs_left({**axes, "model": own}, m.get("exclude") or [], tokens)
    infos = {(d, t): dataset_info({"dataset": d, "seq_len": t}, study) for _, d, t in left}
    out: dict[str, list[tuple]] = {}
    for model, dataset, t in sorted(left):
        kind = "tokens" if tokens[dataset] else "image"
        if kind == (study.models[model].get("input") or "image"):
            info = infos[(dataset, t)]
            out.setdefault(model, []).append((info.shape, info.num_classes))
    return out


def summary(runs: list[RunSpec], dropped: list[Dropped]) -> str:
    """One line: how many runs, and how many combinations were dropped for which reason."""
    line = f"{len(runs)} runs"
    if dropped:
        reasons = Counter(d.reason for d in dropped)
        parts = "; ".join(f"{n} × {r}" for r, n in reasons.most_common())
        line += f", {len(dropped)} combinations dropped ({parts})"
    return line


def study_summary(
    runs: list[RunSpec], dropped: list[Dropped], repeats: int | Mapping[str, int]
) -> str:
    """`summary` of the runs every cell makes (config `repeats`' min), and with {min, max}
    the most the racing step may add."""
    low, high = repeat_range(repeats)
    line = summary([r for r in runs if r.repeat < low], dropped)
    if high > low:
        line += (f"; up to {len(runs)} runs with the repeats the race may add (repeats {low} "
                 f"to {high} a cell)")  # fmt: skip
    return line


#: The config schema (plan.studyconfig's).
CONFIG_SCHEMA = studyconfig.CONFIG_SCHEMA

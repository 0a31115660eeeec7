"""One combination of the matrix's values: why it cannot run, and how its batch lands on its
ranks. Which strategy or model cannot do a combination is the catalog's to say
(`catalog.why_not`); the rules here add the cluster's, the speed options', the knobs', the
batch's and the data's (plan.matrix expands a config through them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainscale import data
from trainscale.data import imagesets, tokens, tokensets
from trainscale.plan import catalog, cluster, datafit, exclusions, knobs, speed_options
from trainscale.plan.preflight import hf_models, own_models
from trainscale.plan.runspec import CellValues, ConfigError
from trainscale.plan.studyconfig import StudyConfig


def why_not(
    values: CellValues,
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


def _split_batch(values: CellValues, world: int) -> tuple[int, int]:
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


@dataclass(frozen=True)
class MatrixContext:
    """What every combination of a study is planned against, read from its config once: the
    axes, which data sets are token sets, the own models' pre-flight facts; the data sets' and
    own models' facts are read as the first combination that needs them meets them."""

    study: StudyConfig  # the study's config, its hf: models given safe names (hf_models.expand)
    accelerator: str  # cpu | cuda
    gpus_per_node: int | None  # GPUs a node's ranks share where known; None: one each
    axes: dict[str, list]  # matrix key -> its values, the out-of-path ones defaulted
    exclude: list  # matrix.exclude
    token_sets: dict[str, bool]  # data set -> whether it is a token set
    own_facts: dict[str, dict]  # own model -> its pre-flight's facts (own_models.check)
    infos: dict[tuple, data.DatasetInfo] = field(default_factory=dict)  # by (data set, seq_len)
    own_models: dict[tuple, own_models.OwnModel] = field(default_factory=dict)  # by model too

    def info(self, values: CellValues) -> data.DatasetInfo:
        """The combination's data set at its seq_len (its files read once)."""
        key = (values["dataset"], values["seq_len"])
        if key not in self.infos:
            self.infos[key] = dataset_info(values, self.study)
        return self.infos[key]

    def own_model(self, values: CellValues) -> own_models.OwnModel | None:
        """The combination's own model with its facts at its data set, None for a built-in."""
        model = values["model"]
        if model not in self.own_facts:
            return None
        key = (model, values["dataset"], values["seq_len"])
        if key not in self.own_models:
            info = self.info(values)
            self.own_models[key] = own_models.frozen(
                model, self.study, self.own_facts, info.shape, info.num_classes
            )
        return self.own_models[key]


@dataclass(frozen=True)
class BatchSplit:
    """How a combination's batch lands on its ranks."""

    world: int  # ranks: workers × nodes
    global_batch: int  # samples a step, all ranks together
    per_worker_batch: int  # samples a step on one rank
    replicas: int  # data-parallel replicas, each fed its own batch (catalog.data_replicas)

    @classmethod
    def of(cls, values: CellValues) -> BatchSplit:
        world = values["workers"] * values["nodes"]
        global_batch, per_worker_batch = _split_batch(values, world)
        replicas = catalog.data_replicas(values["strategy"], world, values["tp"])
        return cls(world, global_batch, per_worker_batch, replicas)


def pipeline_steps(values: CellValues, study: StudyConfig) -> tuple[int, str]:
    """(micro-batches a step, schedule) of config `microbatches` and `pipeline_schedule`: the
    pipeline's schedule accumulates, grad_accum × microbatches micro-batches a step."""
    microbatches = study.microbatches
    if values["strategy"] == "torch-pipeline":
        microbatches *= values["grad_accum"]
    return microbatches, study.pipeline_schedule


def drop_reason(values: CellValues, ctx: MatrixContext) -> str | None:
    """Why this combination does not run (excluded, or a rule of the catalog, the cluster, the
    speed options, the knobs, the batch or the data rules it out), or None."""
    if exclusions.excluded(values, ctx.exclude):
        return "excluded by matrix.exclude"
    own = ctx.own_model(values)
    microbatches, schedule = pipeline_steps(values, ctx.study)
    optimizer = ctx.study.optimizer.name
    return (
        why_not(values, ctx.accelerator, microbatches, schedule, ctx.info(values), own,
                ctx.gpus_per_node)
        or cluster.why_not(values, ctx.study, ctx.accelerator)
        or speed_options.why_not(values["strategy"], values["model"], values["memory_format"],
                                 values["compile"], own, values["grad_accum"])
        or knobs.why_not(values["strategy"], values["model"], values["activation_checkpointing"],
                         values["offload"], optimizer, own)
        or batch_reason(values, ctx)
    )  # fmt: skip


def batch_reason(values: CellValues, ctx: MatrixContext) -> str | None:
    """Why the combination's batch cannot run: a BatchNorm model with one sample a rank, too
    few windows of a token file, fewer steps an epoch than steps_per_epoch; None if it can.
    A batch that does not split over the ranks stops the study (ConfigError)."""
    split = BatchSplit.of(values)
    own, info = ctx.own_model(values), ctx.info(values)
    model = own.row() if own else catalog.MODELS[values["model"]]
    if split.per_worker_batch < 2 and model.batchnorm:
        return f"{values['model']} has BatchNorm: needs at least 2 samples per worker"
    have = (ctx.study.samples if info.synthetic else None) or info.train_samples
    if values["seq_len"] and not info.synthetic:  # a token file: windows of seq_len ids
        have = tokens.window_count(info.train_samples, values["seq_len"])
        if why := datafit.short_of_tokens(values, info, split.replicas, split.per_worker_batch):
            return why
    steps = ctx.study.steps_per_epoch
    return datafit.too_few_steps(values, have, split.replicas, split.per_worker_batch, steps)


def dataset_info(values: CellValues, study: StudyConfig) -> data.DatasetInfo:
    """data.info of the cell's data set: a token set's at the cell's seq_len."""
    name = values["dataset"]
    if values["seq_len"]:
        source = tokensets.source_of(name, study.datasets)
        return tokensets.info(name, source, values["seq_len"])
    return imagesets.info(name, study.datasets, study.steps_per_epoch)

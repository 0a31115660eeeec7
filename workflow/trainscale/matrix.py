"""The experiment matrix: config -> frozen run specifications.

`build_runs` is a pure function of the (schema-validated) config. Each `RunSpec` it returns is
the single source of a run's output path (`RunSpec.path`), of the launcher's argument
(`RunSpec.to_json`) and of the metrics' `spec` (`RunSpec.to_dict`): nothing downstream derives
these again. This module imports neither torch nor TensorFlow, so the Snakefile stays fast.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from trainscale import data
from trainscale.runners import RUNNER_MODULES

#: Matrix keys in path order. `repeat` follows them in the path.
MATRIX_KEYS: tuple[str, ...] = (
    "strategy",
    "model",
    "dataset",
    "scale",
    "batch_size",
    "batch_mode",
    "workers",
    "nodes",
    "precision",
)

#: Strategy -> framework. The vocabulary is fixed; `IMPLEMENTED` says which run in this version.
FRAMEWORK: dict[str, str] = {
    "torch": "torch",
    "torch-dp": "torch",
    "torch-ddp": "torch",
    "torch-fsdp": "torch",
    "torch-pipeline": "torch",
    "tf": "tensorflow",
    "tf-mirrored": "tensorflow",
    "tf-multiworker": "tensorflow",
    "horovod-torch": "horovod",
    "horovod-keras": "horovod",
    "horovod-torch-elastic": "horovod",
    "deepspeed-zero0": "deepspeed",
    "deepspeed-zero1": "deepspeed",
    "deepspeed-zero2": "deepspeed",
    "deepspeed-zero3": "deepspeed",
    "lightning-ddp": "torch",
}
IMPLEMENTED: frozenset[str] = frozenset(RUNNER_MODULES)
#: Strategies that run as one process (which may drive several devices): process rank 0 only.
ONE_PROCESS: frozenset[str] = frozenset({"torch", "torch-dp", "tf", "tf-mirrored"})

#: Smallest square input side each model accepts (spatial sizes must stay >= 1 through the
#: network). Checked against real meta-device forwards in tests/test_models.py.
MODEL_MIN_SIDE: dict[str, int] = {
    "seed-small": 2,
    "seed-large": 8,
    "mnist-convnet": 16,
    "vgg19": 32,
    "resnet50": 1,
    "alexnet": 63,
    "googlenet": 15,
}


#: Top-level blocks of each model (`models.blocks`): the most pipeline stages it splits into.
#: Checked against the built models in tests/test_pipeline.py.
MODEL_BLOCKS: dict[str, int] = {
    "seed-small": 3,
    "seed-large": 6,
    "mnist-convnet": 4,
    "vgg19": 8,
    "resnet50": 18,
    "alexnet": 8,
    "googlenet": 11,
}

#: Models with BatchNorm: training needs at least 2 samples per worker.
BATCHNORM_MODELS: frozenset[str] = frozenset({"resnet50", "googlenet"})


class ConfigError(ValueError):
    """A config that cannot become a run set; the message names the key and the fix."""


@dataclass(frozen=True)
class Fault:
    """A fault injected on purpose (config `faults`): `kind` on rank `rank` in epoch `epoch`."""

    kind: str
    rank: int = 0
    epoch: int = 1


@dataclass(frozen=True)
class RunSpec:
    """Everything one training run needs, fixed before it starts."""

    study: str
    strategy: str
    model: str
    dataset: str
    scale: int
    batch_size: int
    batch_mode: str
    workers: int
    nodes: int
    precision: str
    repeat: int
    seed: int
    epochs: int
    optimizer: str
    lr: float
    base_lr: float
    lr_scaling: str
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    momentum: float
    global_batch_size: int
    per_worker_batch_size: int
    world_size: int
    threads_per_worker: int
    timeout_minutes: float
    target_accuracy: float | None
    data_dir: str
    grad_accum: int = 1
    deepspeed_config: str | None = None
    fault: Fault | None = None
    horovod_timeline: bool = False
    pipeline_schedule: str | None = None
    microbatches: int = 1
    steps_per_epoch: int | None = None
    samples: int | None = None

    @property
    def framework(self) -> str:
        return FRAMEWORK[self.strategy]

    @property
    def path(self) -> str:
        """Run id and output sub-path: `key~value` segments, as Snakemake's Paramspace writes."""
        parts = [f"{k}~{getattr(self, k)}" for k in MATRIX_KEYS]
        return "/".join([*parts, f"repeat~{self.repeat}"])

    @property
    def cell(self) -> tuple:
        """Every matrix value but the repeat: the unit that scaling tables group by."""
        return tuple(getattr(self, k) for k in MATRIX_KEYS)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        names = {f.name for f in fields(cls)}
        missing = {f.name for f in fields(cls) if f.default is MISSING} - set(d)
        if missing:
            raise ValueError(f"run spec lacks {sorted(missing)}")
        kw = {k: d[k] for k in names if k in d}
        kw["betas"] = tuple(kw["betas"])
        if kw.get("fault"):
            kw["fault"] = Fault(**kw["fault"])
        return cls(**kw)

    @classmethod
    def from_json(cls, s: str) -> RunSpec:
        return cls.from_dict(json.loads(s))


@dataclass(frozen=True)
class Dropped:
    """A matrix combination that will not run, and why."""

    values: dict
    reason: str


def config_problems(config: dict, schema: dict) -> list[str]:
    """Every place `config` breaks the config schema, one line each, for people: the key as
    written in YAML (matrix.strategy[0]), the value, what is allowed, and a likely fix for a
    typo ("did you mean ..."). Empty when the config is valid."""
    import difflib

    import jsonschema

    def where(path) -> str:
        out = ""
        for p in path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out or "<top level>"

    lines = []
    validator = jsonschema.Draft202012Validator(schema)
    for e in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path))):
        key = where(e.path)
        if e.validator == "enum":
            allowed = [str(v) for v in e.validator_value]
            close = difflib.get_close_matches(str(e.instance), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            lines.append(f"{key}: {e.instance!r} is not one of {', '.join(allowed)}{hint}")
        elif e.validator == "additionalProperties":
            known = sorted(e.schema.get("properties", {}))
            extra = sorted(set(e.instance) - set(known))
            for k in extra:
                close = difflib.get_close_matches(k, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
                where_k = f"{key}.{k}" if e.path else k
                lines.append(f"{where_k}: unknown key; {hint}")
        elif e.validator == "pattern":
            lines.append(
                f"{key}: {e.instance!r} has characters not allowed here (the value becomes a "
                f"path or part of a command line); allowed: {e.validator_value}"
            )
        else:
            lines.append(f"{key}: {e.message}")
    return lines


def effective_lr(lr: float, scaling: str, global_batch: int, base_batch: int) -> float:
    """Learning rate after the configured batch-size scaling rule."""
    if scaling == "linear":
        return lr * global_batch / base_batch
    if scaling == "sqrt":
        return lr * math.sqrt(global_batch / base_batch)
    return lr


def why_not(
    values: dict, accelerator: str, microbatches: int = 1, schedule: str = "gpipe"
) -> str | None:
    """The reason a strategy or model cannot do this combination, or None if it can."""
    s, world = values["strategy"], values["workers"] * values["nodes"]
    if s == "torch-pipeline":
        reason = _pipeline_why_not(values, world, microbatches, schedule)
        if reason:
            return reason
    if s == "torch" and world > 1:
        return "torch is one process on one device: needs workers=1, nodes=1"
    if s == "torch-dp" and values["nodes"] > 1:
        return "torch-dp (nn.DataParallel) is one process on one node: needs nodes=1"
    if s == "torch-dp" and values["workers"] > 1 and accelerator != "cuda":
        return (
            "torch-dp with workers>1 needs GPUs: without them nn.DataParallel silently runs one "
            "replica in one process, which is not parallel"
        )
    if s == "lightning-ddp" and values["precision"] == "fp16" and accelerator != "cuda":
        return "lightning-ddp: Lightning silently runs fp16 as bf16 on CPU; use precision bf16"
    if s == "tf" and world > 1:
        return "tf is one process on one device: needs workers=1, nodes=1"
    if s == "tf-mirrored" and values["nodes"] > 1:
        return "tf-mirrored (MirroredStrategy) is one process on one node: needs nodes=1"
    # tf-mirrored with workers>1 and no GPUs runs that many logical CPU devices in one process:
    # kept (it exercises the strategy's code path), and its metrics say device.logical = true
    shape = data.info(values["dataset"]).shape
    side = min(shape[1], shape[2])
    need = MODEL_MIN_SIDE[values["model"]]
    if side < need:
        ds = values["dataset"]
        return f"{values['model']} needs inputs of at least {need}×{need}; {ds} is {side}×{side}"
    return None


def _pipeline_why_not(values: dict, world: int, microbatches: int, schedule: str) -> str | None:
    """torch-pipeline: one stage per worker, cut between the model's top-level blocks; the
    global batch is split into `microbatches` equal micro-batches."""
    model, blocks = values["model"], MODEL_BLOCKS[values["model"]]
    if blocks < world:
        return (
            f"torch-pipeline: {model} has {blocks} blocks, too few for {world} pipeline stages "
            "(one per worker)"
        )
    gbs, _ = pipeline_batch(values["batch_size"], values["batch_mode"], world)
    if gbs % microbatches:
        return f"torch-pipeline: microbatches {microbatches} do not divide the batch of {gbs}"
    if gbs // microbatches < 2 and model in BATCHNORM_MODELS:
        return f"torch-pipeline: {model} has BatchNorm: needs micro-batches of at least 2"
    if values["precision"] == "fp16":
        return (
            "torch-pipeline: fp16 needs a loss scaler that skips steps on every stage alike; "
            "use bf16"
        )
    if schedule == "1f1b" and microbatches < world:
        return f"torch-pipeline: 1F1B needs microbatches ({microbatches}) ≥ stages ({world})"
    return None


def pipeline_batch(batch_size: int, mode: str, world: int) -> tuple[int, int]:
    """(global, per-worker) batch of torch-pipeline: no data parallelism, so every stage sees
    the whole global batch (`per_worker` mode: batch_size × stages, weak scaling)."""
    gbs = batch_size * world if mode == "per_worker" else batch_size
    return gbs, gbs


def _excluded(values: dict, exclude: list[dict]) -> bool:
    return any(all(values.get(k) == v for k, v in rule.items()) for rule in exclude)


def fault_for(values: dict, repeat: int, faults: list[dict]) -> Fault | None:
    """The first configured fault whose `match` fits this run, if any."""
    for f in faults:
        if all({**values, "repeat": repeat}.get(k) == v for k, v in f["match"].items()):
            return Fault(f["kind"], f.get("rank", 0), f.get("epoch", 1))
    return None


def _check_faults(faults: list[dict], runs: list[RunSpec]) -> None:
    for i, f in enumerate(faults):
        hit = [r for r in runs if r.fault is not None and fault_for(r.to_dict(), r.repeat, [f])]
        if not hit:
            raise ConfigError(
                f"faults[{i}].match {f['match']} matches no run of the matrix; fix its values "
                "or remove the entry"
            )
        for r in hit:
            processes = 1 if r.strategy in ONE_PROCESS else r.world_size
            if r.fault.rank >= processes:
                raise ConfigError(
                    f"faults[{i}].rank {r.fault.rank} does not exist in {r.path} "
                    f"({processes} processes); use a rank below {processes}"
                )
            if r.fault.epoch > r.epochs:
                raise ConfigError(
                    f"faults[{i}].epoch {r.fault.epoch} is after the last epoch ({r.epochs}); "
                    "use an epoch between 1 and epochs"
                )


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


def build_runs(config: dict, accelerator: str = "cpu") -> tuple[list[RunSpec], list[Dropped]]:
    """Expand a validated config into run specs (cartesian product minus exclusions).

    `accelerator` is "cpu" or "cuda": what the workers will run on, used only to drop
    combinations that cannot be parallel there (e.g. DataParallel without GPUs).
    """
    m = config["matrix"]
    not_yet = [s for s in m["strategy"] if s not in IMPLEMENTED]
    if not_yet:
        raise ConfigError(
            f"matrix.strategy: {', '.join(not_yet)} not implemented in this version of trainscale "
            f"(available: {', '.join(sorted(IMPLEMENTED))}); remove it from matrix.strategy"
        )
    opt = config["optimizer"]
    ds_fragment = config.get("deepspeed_config")
    uses_deepspeed = any(FRAMEWORK[s] == "deepspeed" for s in m["strategy"])
    if uses_deepspeed and ds_fragment and not Path(ds_fragment).is_file():
        raise ConfigError(
            f"deepspeed_config: {ds_fragment} does not exist; give the path of a DeepSpeed "
            "config fragment (JSON or YAML), relative to the directory Snakemake runs in, or "
            "remove the key"
        )
    runs: list[RunSpec] = []
    dropped: list[Dropped] = []
    for combo in itertools.product(*(m[k] for k in MATRIX_KEYS)):
        values = dict(zip(MATRIX_KEYS, combo, strict=True))
        if _excluded(values, m.get("exclude", [])):
            dropped.append(Dropped(values, "excluded by matrix.exclude"))
            continue
        pipe = values["strategy"] == "torch-pipeline"
        mb, schedule = config.get("microbatches", 4), config.get("pipeline_schedule", "gpipe")
        reason = why_not(values, accelerator, mb, schedule)
        if reason:
            dropped.append(Dropped(values, reason))
            continue
        world = values["workers"] * values["nodes"]
        split = pipeline_batch if pipe else batch_sizes
        gbs, pwbs = split(values["batch_size"], values["batch_mode"], world)
        if pwbs < 2 and values["model"] in BATCHNORM_MODELS:
            reason = f"{values['model']} has BatchNorm: needs at least 2 samples per worker"
            dropped.append(Dropped(values, reason))
            continue
        synthetic = data.info(values["dataset"]).synthetic
        samples = config.get("samples") if synthetic else None
        limit = config.get("steps_per_epoch")
        reason = _too_few_steps(values, samples, world, pwbs, limit)
        if reason:
            dropped.append(Dropped(values, reason))
            continue
        lr = effective_lr(opt["lr"], config["lr_scaling"], gbs, config["base_batch_size"])
        is_ds = FRAMEWORK[values["strategy"]] == "deepspeed"
        grad_accum = config.get("grad_accum", 1) if is_ds else 1
        if pwbs % grad_accum:
            raise ConfigError(
                f"grad_accum {grad_accum} does not divide the per-worker batch {pwbs} of "
                f"{values['strategy']} with batch_size {values['batch_size']} on {world} "
                "workers; choose a grad_accum that divides it or exclude the cell"
            )
        for repeat in range(config["repeats"]):
            runs.append(
                RunSpec(
                    study=config["study"],
                    **values,
                    repeat=repeat,
                    seed=config["seed"] + repeat,
                    epochs=config["epochs"],
                    optimizer=opt["name"],
                    lr=lr,
                    base_lr=opt["lr"],
                    lr_scaling=config["lr_scaling"],
                    betas=tuple(opt["betas"]),
                    eps=opt["eps"],
                    weight_decay=opt["weight_decay"],
                    momentum=opt["momentum"],
                    global_batch_size=gbs,
                    per_worker_batch_size=pwbs,
                    world_size=world,
                    threads_per_worker=config["threads_per_worker"],
                    timeout_minutes=config["timeout_minutes"],
                    target_accuracy=config.get("target_accuracy"),
                    data_dir=config["data_dir"],
                    grad_accum=grad_accum,
                    deepspeed_config=ds_fragment if is_ds else None,
                    fault=fault_for(values, repeat, config.get("faults", [])),
                    horovod_timeline=config.get("horovod_timeline", False)
                    and FRAMEWORK[values["strategy"]] == "horovod",
                    pipeline_schedule=schedule if pipe else None,
                    microbatches=mb if pipe else 1,
                    steps_per_epoch=limit,
                    samples=samples,
                )
            )
    if not runs:
        raise ConfigError(
            "the matrix is empty after exclusions and impossible combinations: "
            + summary(runs, dropped)
            + "; widen matrix or shorten matrix.exclude"
        )
    _check_faults(config.get("faults", []), runs)
    return runs, dropped


def _too_few_steps(
    values: dict, samples: int | None, world: int, per_worker_batch: int, limit: int | None
) -> str | None:
    """Why a cell cannot run `steps_per_epoch` steps per epoch (its data set, scaled, has fewer
    batches), or None. A cell that ran fewer steps than the others would time something else."""
    if limit is None:
        return None
    n = (samples or data.info(values["dataset"]).train_samples) * values["scale"]
    ranks = 1 if values["strategy"] == "torch-pipeline" else world
    full = n // ranks // per_worker_batch
    if full >= limit:
        return None
    return (
        f"steps_per_epoch {limit} is more than the {full} steps one epoch of "
        f"{values['dataset']} has at this batch (raise scale or samples, or lower steps_per_epoch)"
    )


def summary(runs: list[RunSpec], dropped: list[Dropped]) -> str:
    """One line: how many runs, and how many combinations were dropped for which reason."""
    line = f"{len(runs)} runs"
    if dropped:
        reasons = Counter(d.reason for d in dropped)
        parts = "; ".join(f"{n} × {r}" for r, n in reasons.most_common())
        line += f", {len(dropped)} combinations dropped ({parts})"
    return line


def gpu_count() -> int:
    """NVIDIA GPUs on this host, from the driver's /proc entries (no CUDA import)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return sum(1 for _ in gpus.iterdir()) if gpus.is_dir() else 0


def detect_accelerator(setting: str = "auto") -> str:
    """Resolve config `accelerator`: 'auto' means 'cuda' when this host has NVIDIA GPUs."""
    if setting != "auto":
        return setting
    return "cuda" if gpu_count() else "cpu"


def capacity_problems(runs: list[RunSpec], accelerator: str, cpus: int, gpus: int) -> list[str]:
    """What runs ask of this one machine that it does not have (for studies run here, not
    through a cluster profile): several nodes, or more workers than GPUs or CPU cores (on CPU
    a worker stands for a device and needs a core of its own)."""
    problems = []
    nodes = sorted({r.nodes for r in runs if r.nodes > 1})
    if nodes:
        problems.append(
            f"matrix.nodes {nodes}: runs across nodes need a cluster; run with "
            "--profile profiles/slurm (docs/slurm.md), or use nodes: [1] here"
        )
    have, unit = (gpus, "GPUs") if accelerator == "cuda" else (cpus, "CPU cores")
    workers = sorted({r.workers for r in runs if r.workers > have})
    if workers:
        problems.append(
            f"matrix.workers {workers}: this machine has {have} {unit}, and a worker needs one; "
            f"use workers up to {have}, exclude those cells, or run on a cluster "
            "(--profile profiles/slurm)"
        )
    return problems


CONFIG_SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"


def check_file(path: str | Path, base: Path | None = None) -> list[str]:
    """Problems of a config file as `snakemake --configfile` would meet them: laid over `base`
    (the workflow's config.yaml unless it is that file) as trainscale.overlay describes, with
    the keys it inherits listed, and with the line of a YAML syntax error (Snakemake only says
    the file is not valid YAML)."""
    import os

    import yaml

    from trainscale import overlay

    base = overlay.BASE_CONFIG if base is None else base
    try:
        config = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        return [f"{path}: cannot read it ({e.strerror})"]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return [f"{path}:{where}: not valid YAML: {getattr(e, 'problem', e)}"]
    if not isinstance(config, dict):
        return [f"{path}: a config is a mapping of keys (study:, matrix:, ...)"]
    inherited: list = []
    if base.is_file() and Path(path).resolve() != base.resolve():
        base_config = yaml.safe_load(base.read_text()) or {}
        unnamed = overlay.unnamed_study(config, [path], base_config.get("study"))
        if unnamed:
            return [unnamed]
        inherited = overlay.inherited(base_config, config)
        config = overlay.overlay(base_config, config)
    problems = config_problems(config, yaml.safe_load(CONFIG_SCHEMA.read_text()))
    if problems:
        return [f"{path}: {p}" for p in problems]
    from snakemake.utils import validate

    validate(config, str(CONFIG_SCHEMA))  # fills in the defaults, as the workflow does
    try:
        runs, dropped = build_runs(config, detect_accelerator(config["accelerator"]))
    except ConfigError as e:
        return [f"{path}: {e}"]
    print(f"{path}: study {config['study']!r}: {summary(runs, dropped)}")
    if inherited:
        print(f"  inherited from {os.path.relpath(base)}:")
        print("\n".join(f"    {line}" for line in overlay.describe(inherited)))
    return []


def main(argv: list[str] | None = None) -> int:
    """`python -m trainscale.matrix CONFIG...`: check config files without running anything,
    each laid over the workflow's config.yaml as `snakemake --configfile CONFIG` lays it."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m trainscale.matrix", description=main.__doc__)
    p.add_argument("configs", nargs="+", type=Path)
    p.add_argument(
        "--base", type=Path, default=None, help="the config laid under each (default: config.yaml)"
    )
    args = p.parse_args(argv)
    problems = [line for c in args.configs for line in check_file(c, args.base)]
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

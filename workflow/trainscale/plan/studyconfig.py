"""`StudyConfig`: a study's config once checked and its defaults filled from the schema
(workflow/schemas/config.schema.yaml), as a frozen record. Planning reads its typed fields; the
sections not yet typed, and code still written against the dict, read `raw` (read-only).

Every key is described in the schema; no default is written here again: a field holds the
config's value, or where the config lacks the key (a config planned with Snakemake's
skip_validation, or built by hand), the schema's default; None where the schema has none.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainscale.plan.runspec import ConfigError

#: The config schema: every key of a study, its type, its default.
CONFIG_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"


@dataclass(frozen=True)
class Repeats:
    """Config `repeats`: every cell runs `min`, the racing step may ask up to `max`."""

    min: int
    max: int

    @classmethod
    def parse(cls, repeats: int | Mapping) -> Repeats:
        """An integer n is (n, n); ConfigError where max < min."""
        if isinstance(repeats, int):
            return cls(repeats, repeats)
        low, high = repeats["min"], repeats["max"]
        if high < low:
            raise ConfigError(f"repeats: max {high} is below min {low}; give max >= min")
        return cls(low, high)

    @property
    def racing(self) -> bool:
        """Whether the racing step may add repeats past `min`."""
        return self.max > self.min


@dataclass(frozen=True)
class Optimizer:
    """Config `optimizer`: one for every run of the study."""

    name: str
    lr: float  # before matrix lr_scaling
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    momentum: float
    fused: bool | str  # auto | true | false


@dataclass(frozen=True)
class Memory:
    """Config `memory`: the device limit a cell must fit (plan.preflight.memory resolves it)."""

    limit_gib: float | None
    headroom: float
    check: str | None  # drop | warn | off; None: by accelerator
    host_limit_gib: float | None

    @classmethod
    def of(cls, section: Mapping[str, Any] | None) -> Memory:
        """The record of a `memory:` section alone (the schema's defaults where it lacks a
        key)."""
        return _section(cls, "memory", {"memory": section or {}})


@dataclass(frozen=True)
class Collectives:
    """Config `collectives`: the all-reduce benchmark beside the runs."""

    enabled: bool
    warmup: int
    iters: int
    timeout_minutes: float
    max_bytes: int | None


@dataclass(frozen=True)
class StudyConfig:
    """The study's config, validated, defaults filled: what `study_plan` plans from."""

    study: str
    matrix: Mapping[str, Any]  # axis -> its values, and `exclude`
    accelerator: str  # cpu | cuda | auto, as written (plan.machine resolves auto)
    seed: int  # the first repeat's; repeat i runs seed + i
    repeats: Repeats
    epochs: int
    steps_per_epoch: int | None  # None: a whole epoch
    samples: int | None  # a synthetic data set's training samples; None: its own
    eval_tokens: int  # test tokens one evaluation of a token set scores
    data_dir: str
    threads_per_worker: int
    timeout_minutes: float
    target_accuracy: float | None
    optimizer: Optimizer
    lr_scaling: str  # none | linear | sqrt
    base_batch_size: int  # the global batch optimizer.lr is given for
    microbatches: int  # torch-pipeline's micro-batches a step (times grad_accum)
    pipeline_schedule: str  # torch-pipeline's schedule
    deepspeed_config: str | None  # the DeepSpeed fragment's path
    horovod_timeline: bool
    ps_tasks: int  # tf-ps's parameter servers
    loader_workers: int  # a user data set's loader processes beside each training worker
    memory_format: str  # the speed options' study-wide values (a matrix axis overrides them)
    compile: bool
    grad_accum: int
    code: tuple[str, ...]  # folders the own models' builders are imported from
    faults: tuple[Mapping[str, Any], ...]  # faults planted in runs (plan.faults)
    memory: Memory
    collectives: Collectives
    cost: Mapping[str, Any]
    report: Mapping[str, Any]
    tune: Mapping[str, Any]
    predict: Mapping[str, Any]
    env: Mapping[str, str]
    slurm: Mapping[str, Any]
    models: Mapping[str, Mapping[str, Any]]  # own model -> its `models:` entry
    datasets: Mapping[str, Mapping[str, Any]]  # data set -> its `datasets:` entry
    container: Mapping[str, Any] | None
    raw: Mapping[str, Any]  # the whole config as given, read-only, for code not yet typed

    @classmethod
    def from_filled(cls, filled: Mapping[str, Any]) -> StudyConfig:
        """The record of a config already checked and filled (plan.check.fill_defaults); a
        deep copy, so the record never changes with the dict it came from. A key the config
        lacks is the schema's default in its field, and stays absent from `raw`."""
        raw = copy.deepcopy(dict(filled))
        top = _frozen({**schema_defaults(), **raw})
        scalars = {name: top.get(name) for name in _SCALARS}
        return cls(
            **scalars,
            repeats=Repeats.parse(top["repeats"]),
            optimizer=_section(Optimizer, "optimizer", top, betas=tuple),
            memory=_section(Memory, "memory", top),
            collectives=_section(Collectives, "collectives", top),
            container=top.get("container") or None,
            code=tuple(top.get("code") or ()),
            faults=tuple(top.get("faults") or ()),
            **{name: top.get(name) or MappingProxyType({}) for name in _SECTIONS},
            raw=_frozen(raw),
        )

    def as_dict(self) -> dict[str, Any]:
        """A mutable deep copy of the config as given, for code that takes `config: dict`."""
        return copy.deepcopy(thawed(self.raw))


#: StudyConfig's fields taken as they are (schema-checked scalars and the matrix)
_SCALARS = (
    "study",
    "matrix",
    "accelerator",
    "seed",
    "epochs",
    "steps_per_epoch",
    "samples",
    "eval_tokens",
    "data_dir",
    "threads_per_worker",
    "timeout_minutes",
    "target_accuracy",
    "lr_scaling",
    "base_batch_size",
    "microbatches",
    "pipeline_schedule",
    "deepspeed_config",
    "horovod_timeline",
    "ps_tasks",
    "loader_workers",
    "memory_format",
    "compile",
    "grad_accum",
)
#: StudyConfig's sections read by key (not typed yet): {} where absent
_SECTIONS = ("cost", "report", "tune", "predict", "env", "slurm", "models", "datasets")


@functools.cache
def config_schema() -> dict:
    """The config schema, read once, with libyaml where PyYAML has it (the pure-Python reader
    took a tenth of a second of every Snakemake start). Not to be changed: copy it first."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(CONFIG_SCHEMA.read_text(), Loader=loader)


def schema_defaults(section: str | None = None) -> dict[str, Any]:
    """{key: the schema's default} of the top level, or of one section's keys."""
    properties = config_schema()["properties"]
    if section is not None:
        properties = properties[section].get("properties", {})
    return {k: copy.deepcopy(p["default"]) for k, p in properties.items() if "default" in p}


def _section(kind: type, name: str, config: Mapping[str, Any], **convert) -> Any:
    """The record `kind` of the config's section `name`: a key it lacks is the schema's
    default (None where there is none)."""
    values = {**schema_defaults(name), **(config.get(name) or {})}
    fields = {name: values.get(name) for name in kind.__dataclass_fields__}
    for name, to in convert.items():
        if fields[name] is not None:
            fields[name] = to(fields[name])
    return kind(**fields)


def _frozen(value: Any) -> Any:
    """A read-only view: mappings as MappingProxyType, lists as tuples, all the way down."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """A frozen section undone: dicts and lists again (for JSON, and code that mutates)."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thawed(v) for v in value]
    return value

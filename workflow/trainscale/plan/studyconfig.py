"""`StudyConfig`: a study's config once checked and its defaults filled from the schema
(workflow/schemas/config.schema.yaml), as a frozen record. Planning reads its typed fields; the
sections not yet typed, and code still written against the dict, read `raw` (read-only).

Every key is described in the schema; no default is written here again: a field's value is the
filled config's, so a key the schema gives no default is None when the study leaves it out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from trainscale.plan.runspec import ConfigError


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
    seed: int
    repeats: Repeats
    epochs: int
    steps_per_epoch: int | None
    data_dir: str
    threads_per_worker: int
    timeout_minutes: float
    optimizer: Optimizer
    memory: Memory
    collectives: Collectives
    cost: Mapping[str, Any]
    report: Mapping[str, Any]
    tune: Mapping[str, Any]
    predict: Mapping[str, Any]
    env: Mapping[str, str]
    container: Mapping[str, Any] | None
    raw: Mapping[str, Any]  # the whole filled config, read-only, for code not yet typed

    @classmethod
    def from_filled(cls, filled: Mapping[str, Any]) -> StudyConfig:
        """The record of a config already checked and filled (plan.check.fill_defaults); a
        deep copy, so the record never changes with the dict it came from."""
        raw = copy.deepcopy(dict(filled))
        return cls(
            study=raw["study"],
            matrix=_frozen(raw["matrix"]),
            accelerator=raw.get("accelerator", "auto"),
            seed=raw.get("seed", 0),
            repeats=Repeats.parse(raw.get("repeats", 1)),
            epochs=raw.get("epochs"),
            steps_per_epoch=raw.get("steps_per_epoch"),
            data_dir=raw.get("data_dir"),
            threads_per_worker=raw.get("threads_per_worker"),
            timeout_minutes=raw.get("timeout_minutes"),
            optimizer=_section(Optimizer, raw.get("optimizer"), betas=tuple),
            memory=_section(Memory, raw.get("memory")),
            collectives=_section(Collectives, raw.get("collectives")),
            cost=_frozen(raw.get("cost") or {}),
            report=_frozen(raw.get("report") or {}),
            tune=_frozen(raw.get("tune") or {}),
            predict=_frozen(raw.get("predict") or {}),
            env=_frozen(raw.get("env") or {}),
            container=_frozen(raw["container"]) if raw.get("container") else None,
            raw=_frozen(raw),
        )

    def as_dict(self) -> dict[str, Any]:
        """A mutable deep copy of the filled config, for code that takes `config: dict`."""
        return copy.deepcopy(_thawed(self.raw))


def _section(kind: type, values: Mapping | None, **convert) -> Any:
    """A section's record from its filled mapping: a key it lacks is None (a config planned
    with skip_validation has no defaults filled)."""
    values = values or {}
    names = kind.__dataclass_fields__
    fields = {name: values.get(name) for name in names}
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


def _thawed(value: Any) -> Any:
    """`_frozen` undone: dicts and lists again."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value

"""`study_plan`: a study's config -> its `Plan`, everything fixed before the first job.

The workflow (rules/common.smk) plans once and reads only the `Plan`; tests call `study_plan`
directly. The steps, in the order the workflow always took them: the config's problems listed
at once, YAML's boolean words put back, the schema's defaults filled, the runs expanded
(plan.matrix), the prices checked (plan.prices), the memory limit resolved and the cells over it
dropped (plan.fit). No environment is changed and nothing is shown here but what those steps
print; the study's environment, the progress line and the messages stay in common.smk.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainscale.plan import configcheck, fit, machine, matrix, prices
from trainscale.plan.preflight import memory
from trainscale.plan.runspec import ConfigError, Dropped, RunSpec
from trainscale.plan.studyconfig import StudyConfig, config_schema

#: The checkout (Snakemake's workflow.basedir): the schema's path in an error is given from it.
REPO_ROOT = matrix.CONFIG_SCHEMA.parents[2]


@dataclass(frozen=True)
class Plan:
    """What a study runs, planned for one machine: every run that may run, the cells dropped
    with their reasons, and each run's predicted memory."""

    config: StudyConfig
    accelerator: str  # cpu | cuda: what the workers train on
    gpus_per_node: int | None  # the GPUs a node's ranks share; None: a GPU each
    runs: list[RunSpec]  # every repeat a cell may run, the racing step's too
    dropped: list[Dropped]  # the cells that will not run, each with its reason
    predicted: dict[str, dict]  # run path -> its `memory.predicted` block
    memory: memory.Check  # config `memory:` resolved
    run_by_path: Mapping[str, RunSpec]  # the paths made once (RunSpec.path builds each time)

    @property
    def repeats_min(self) -> int:
        """Repeats every cell runs."""
        return self.config.repeats.min

    @property
    def repeats_max(self) -> int:
        """Repeats a cell runs at most, with those the racing step asks for."""
        return self.config.repeats.max

    @property
    def racing(self) -> bool:
        """Whether the racing step (repeats.smk) may ask for repeats past the minimum."""
        return self.config.repeats.racing

    @property
    def first_runs(self) -> list[str]:
        """The paths of the runs every cell makes (repeats below the minimum)."""
        return [path for path, run in self.run_by_path.items() if run.repeat < self.repeats_min]

    @property
    def summary(self) -> str:
        """One line for people: the runs, the drops and their reasons, the race's room."""
        return matrix.study_summary(self.runs, self.dropped, self.config.raw["repeats"])


def validated(config: Mapping[str, Any], fill_defaults: bool = True) -> StudyConfig:
    """`config` checked against the schema (ConfigError listing every problem, each with its
    key and fix) and, unless `fill_defaults` is False (Snakemake's skip_validation), its
    defaults filled from the schema; `config` itself is not changed."""
    filled = copy.deepcopy(dict(config))
    schema = config_schema()
    configcheck.yaml_booleans_as_words(filled, schema)  # `check: off` unquoted reads as false
    problems = configcheck.config_problems(filled, schema)
    if problems:
        where = matrix.CONFIG_SCHEMA.relative_to(REPO_ROOT)
        raise ConfigError(
            f"the study's config has problems; fix these keys (documented in {where}):\n  - "
            + "\n  - ".join(problems)
        )
    if fill_defaults:
        # a fresh copy of the schema's defaults: the validator hands out its own objects
        configcheck.fill_defaults(filled, copy.deepcopy(schema))
    return StudyConfig.from_filled(filled)


def study_plan(
    config: Mapping[str, Any] | StudyConfig,
    accelerator: str = "cpu",
    gpus_per_node: int | None = None,
    *,
    fill_defaults: bool = True,
    gpu_names: list[str] | None = None,
    show_memory: bool = False,
) -> Plan:
    """The plan of the study `config` describes (config.yaml with any study file laid over it,
    plan.overlay), its workers on `accelerator` (cpu or cuda, already resolved:
    plan.machine.detect_accelerator), with `gpus_per_node` GPUs to a node where known (a study
    run on this machine) or None (each worker gets one). `gpu_names`: this machine's GPUs, for
    the prices (read through NVML where GPUs are given and the names are not). ConfigError,
    naming the key and the fix, where the study cannot be planned. A `StudyConfig` given
    (`validated`'s, as the workflow makes it before it knows its accelerator) is not checked
    again. `show_memory`: each cell's memory predicted even where memory.check is off
    (trainscale check)."""
    study = config if isinstance(config, StudyConfig) else validated(config, fill_defaults)
    runs, dropped = matrix.build_runs(study, accelerator, gpus_per_node)
    if gpu_names is None:
        gpu_names = machine.gpu_names() if gpus_per_node else []
    if price_problem := prices.check(study, accelerator, gpu_names):
        raise ConfigError(price_problem)
    limits = memory.resolve(study.memory, accelerator, show=show_memory)
    runs, dropped, predicted = fit.within_limits(limits, runs, dropped, accelerator, study)
    return Plan(
        config=study,
        accelerator=accelerator,
        gpus_per_node=gpus_per_node,
        runs=runs,
        dropped=dropped,
        predicted=predicted,
        memory=limits,
        run_by_path={run.path: run for run in runs},
    )

"""Plan: what a study runs, fixed before any job. No framework is imported here.

`study_plan(config, accelerator, gpus_per_node) -> Plan` plans a study (plan.study), from its
`StudyConfig` (plan.studyconfig: the config checked, its defaults filled once).

Read top to bottom (a layers contract in pyproject.toml keeps it so):

- `check`: `trainscale check` (a config file's problems, then its plan) and `trainscale fit`;
- `study`: the whole plan, the steps below in order;
- `configcheck`: the config's problems against the schema, its defaults filled;
- `fit`: the cells over config `memory:`'s limits dropped with the reason and the advice, and
  the largest batch that fits;
- `matrix`: a config expanded into frozen run specs, one combination of its values at a time
  (`combination`: why it cannot run, how its batch splits), with its rules in `speed_options`,
  `knobs`, `faults`, `datafit`, `exclusions`, `cluster` (container, env, SLURM keys),
  `prices`, `overlay` (a study file laid over config.yaml), `deepspeed_config`, and
  `preflight/` (what asks a child process before any job: own and `hf:` models, the memory
  estimate);
- `studyconfig`: the checked config as a frozen record;
- `machine`: the GPUs of the host that plans, and what `accelerator: auto` means there;
- `runspec`: the frozen run spec;
- `catalog/`: one row of facts per strategy and per model, and their rules.

May import: data (to check the data sets a study names).
"""

from typing import Any

#: what `from trainscale.plan import ...` gives without importing the whole plan: a runner
#: that reads a run spec (plan.runspec) does not load the matrix, the data sets and the checks
_LAZY = {"study_plan": "study", "Plan": "study", "StudyConfig": "studyconfig"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'trainscale.plan' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"trainscale.plan.{_LAZY[name]}"), name)


__all__ = ["Plan", "StudyConfig", "study_plan"]

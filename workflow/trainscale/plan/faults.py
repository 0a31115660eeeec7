"""Faults planted on purpose (config `faults`, docs/failures.md): which run each entry strikes,
and the checks, before any job, that every entry strikes a run where it can happen.

A fault is part of its run's spec (plan.runspec.Fault), so the record says it was injected.
The runners cause it: mid-epoch (runners.common.maybe_fault), or, with `part`, in a
measurement after the timed steps (runners.guarded)."""

from __future__ import annotations

from trainscale.data import imagesets
from trainscale.plan import catalog
from trainscale.plan.runspec import ConfigError, Fault, RunSpec


def fault_for(values: dict, repeat: int, faults: list[dict]) -> Fault | None:
    """The first configured fault whose `match` fits this run, if any."""
    for f in faults:
        if all({**values, "repeat": repeat}.get(k) == v for k, v in f["match"].items()):
            return Fault(f["kind"], f.get("rank", 0), f.get("epoch", 1), f.get("part"))
    return None


def check(faults: list[dict], runs: list[RunSpec]) -> None:
    """ConfigError where an entry matches no run, names a rank or epoch the run lacks, or a
    part the run never reaches."""
    for i, f in enumerate(faults):
        hit = [r for r in runs if r.fault is not None and fault_for(r.to_dict(), r.repeat, [f])]
        if not hit:
            raise ConfigError(
                f"faults[{i}].match {f['match']} matches no run of the matrix; fix its values "
                "or remove the entry"
            )
        for r in hit:
            processes = 1 if catalog.STRATEGIES[r.strategy].one_process else r.world_size
            if r.ps_tasks:  # tf-ps: only its coordinator (rank 0) runs Python training code
                processes = 1
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
            why = _part_missing(r) if r.fault.part else None
            if why:
                raise ConfigError(
                    f"faults[{i}].part {r.fault.part!r}: {r.path} {why}; choose another part "
                    f"or narrow faults[{i}].match"
                )


#: runners without a framework block of their own (faults[].part `framework`)
_NO_FRAMEWORK_BLOCK = ("lightning.ddp", "tf_ps")


def _part_missing(r: RunSpec) -> str | None:
    """Why the run `r` never reaches the part its fault is planted in (None: it does)."""
    f, row = r.fault, catalog.STRATEGIES[r.strategy]
    if f.kind != "raise":
        return f"is planted with kind {f.kind!r}; a fault in a part after training is kind raise"
    if f.part == "communication" and (r.world_size == 1 or row.exposed_unmeasured):
        return "measures no exposed communication (one worker, or a strategy that cannot)"
    if f.part == "framework" and row.runner in _NO_FRAMEWORK_BLOCK:
        return f"has no framework block ({r.strategy} writes none)"
    if f.part == "evaluation":
        if imagesets.spec_info(r.to_dict()).synthetic:
            return "evaluates nothing (synthetic data: random labels)"
        if r.target_accuracy is None and f.epoch != r.epochs:
            return (
                f"evaluates after its last epoch ({r.epochs}) only, not in epoch {f.epoch} "
                "(every epoch with target_accuracy)"
            )
    return None

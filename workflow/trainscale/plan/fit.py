"""What fits: the cells of a study over config `memory:`'s limits dropped before any job with
the reason, what would bring each under them, and `trainscale fit CONFIG`, the largest batch
size that fits per strategy × model × world size.

The predictions are the estimator's (trainscale.plan.preflight.memory); this module asks it
about cells the matrix's rules build (`one_cell`), so it sits above the matrix.

- `within_limits`: the runs that fit, the dropped ones with the reason (the nearest cells of
  the matrix that fit, and the knobs that would, each with its predicted GiB), and every run's
  `memory.predicted` block.
- The advice: the same cell with full activation checkpointing, with offload, on twice the
  workers, and at smaller batches, each predicted as any cell is (a model of many identical
  blocks is traced at a few of them and scaled, so the variants cost a few small traces).
- `trainscale fit`: the batch sizes tried are those the study could run: powers of two and
  three times them, and the study's own `matrix.batch_size`, up to `--max-batch`, each kept
  only where the matrix's rules keep the cell (it splits over the workers, micro-batches and
  tensor-parallel groups, and an epoch holds a global batch). The need grows with the batch,
  so each cell is bisected over them, every cell's probe of a round in one child.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from trainscale.plan.matrix import ConfigError, build_runs
from trainscale.plan.preflight import hf_models, memory, memory_parts
from trainscale.plan.preflight.memory import GIB, Check, block, need, predict, replica_spec
from trainscale.plan.runspec import MATRIX_KEYS, Dropped, RunSpec
from trainscale.plan.studyconfig import StudyConfig

#: halvings of the batch tried by the advice
HALVINGS = 3


def within_limits(
    check: Check, runs: list[RunSpec], dropped: list[Dropped], target: str,
    study: StudyConfig | None = None,
) -> tuple[list[RunSpec], list[Dropped], dict[str, dict]]:  # fmt: skip
    """The runs that fit (all of them unless memory.check is drop and memory.host_limit_gib
    is not exceeded), `dropped` with the cells dropped here after it (a new list), and every
    run's `memory.predicted` block by path (its host bytes at least: those need no trace).
    Nothing is traced when memory.check is off. Each prediction is printed where the answer
    is read; `study` (the study's config) lets a reason say which knob would bring a cell
    under the limit."""
    if not runs:
        return runs, dropped, {}
    answers, replicas = _traced(check, runs, target)
    by_cell: dict[tuple, dict] = {}  # a cell's repeats share their prediction
    for r in runs:
        if r.cell not in by_cell:
            by_cell[r.cell] = block(answers.get(r.path), check, r, target, replicas.get(r.path))
    blocks = {r.path: by_cell[r.cell] for r in runs}
    notes = [f"memory of {r.path} not predicted: {a['error']}" for r in runs
             if "error" in (a := answers.get(r.path, {}))]  # fmt: skip
    over, reasons = _over_limits(check, runs, blocks, answers, study, target)
    drop = check.mode != "warn"  # off: only the host limit, which drops
    said = [(r, reasons[r.path]) for r in runs if r.path in reasons]  # one run of each cell
    if drop:
        new = [Dropped({k: getattr(r, k) for k in MATRIX_KEYS}, why) for r, why in said]
        dropped = [*dropped, *new]
    else:
        notes += [f"{why} (memory.check: warn, kept)" for _, why in said]
    kept = [r for r in runs if r.path not in over] if drop else runs
    for line in notes:
        print(f"trainscale: memory: {line}", file=sys.stderr)
    if not kept:
        raise ConfigError(
            f"memory: every cell is over {check.describe()} per device or its host limit: "
            + "; ".join(d.reason for d in dropped[-3:])
        )
    return kept, dropped, blocks


def _traced(
    check: Check, runs: list[RunSpec], target: str
) -> tuple[dict[str, dict], dict[str, dict]]:
    """({run path: its answer}, {run path: its whole-model replica's answer}) from the
    estimator; both empty when memory.check is off."""
    if check.mode == "off":
        return {}, {}
    extra = {r.path: replica_spec(r) for r in runs}
    extra = {p: s for p, s in extra.items() if s is not None}
    found = predict([*runs, *extra.values()], target)
    return {r.path: found[r.path] for r in runs}, {p: found[s.path] for p, s in extra.items()}


def _over_limits(
    check: Check,
    runs: list[RunSpec],
    blocks: dict[str, dict],
    answers: dict[str, dict],
    study: StudyConfig | None,
    target: str,
) -> tuple[set[str], dict[str, str]]:
    """(the paths of every run over the host or the device limit, the reason of the first
    run of each such cell): over the host limit first, then, where memory.check traces,
    over the device's allowed bytes, the reason with the nearest cells that fit and advice."""
    host_why = {}
    for r in runs:
        if why := host_over(r, blocks[r.path]["host_bytes"], check):
            host_why[r.path] = why
    host = set(host_why)
    reasons = {r.path: host_why[r.path] for r in _firsts(runs, host)}
    allowed = check.allowed_bytes
    if allowed is None or check.mode == "off":
        return host, reasons
    too_big = {r.path for r in runs if need(answers[r.path]) > allowed}
    fits = [r for r in runs if r.path not in too_big and r.path not in host]
    firsts = _firsts(runs, too_big - host)
    advice = {}  # every cell's knobs predicted in one child
    if study is not None and firsts:
        advice = advise(study, firsts, allowed, target)
    for r in firsts:
        reasons[r.path] = over_reason(r, need(answers[r.path]), check, fits, advice.get(r.path))
    return host | too_big, reasons


def _firsts(runs: list[RunSpec], paths: set[str]) -> list[RunSpec]:
    """The first run of each cell among `paths`, in the order of `runs`."""
    firsts: dict[tuple, RunSpec] = {}
    for r in runs:
        if r.path in paths:
            firsts.setdefault(r.cell, r)
    return list(firsts.values())


def host_over(r: RunSpec, host_bytes: int, check: Check) -> str | None:
    """Why `r`'s ranks on a node do not fit memory.host_limit_gib (None: they do)."""
    if check.host_limit_gib is None:
        return None
    mb = memory_parts.slurm_mem_mb(r, host_bytes)
    if mb * 2**20 <= check.host_limit_gib * GIB:
        return None
    per_node = -(-r.processes // r.nodes)
    return (
        f"{r.strategy} {r.model} batch {r.batch_size}: its {per_node} ranks on a node need "
        f"{mb * 2**20 / GIB:.3g} GiB of host memory ({host_bytes / GIB:.3g} GiB each, with the "
        f"request's margin), over memory.host_limit_gib {check.host_limit_gib:g}"
    )


def over_reason(r: RunSpec, needed: int, check: Check, fits: list[RunSpec],
                advice: str | None = None) -> str:  # fmt: skip
    """Why `r` is dropped, the nearest cells of the matrix that fit and which knobs' predicted
    needs are under the limit (`advice`, from `advise`)."""
    why = (f"{r.strategy} {r.model} batch {r.batch_size}: needs {needed / GIB:.3g} GiB per "
           f"rank, over {check.describe()}; {nearest(r, fits)}")  # fmt: skip
    return why + (f"; {advice}" if advice else "")


def nearest(r: RunSpec, fits: list[RunSpec]) -> str:
    """The nearest fitting cells of the same model, data and precision: the largest smaller
    batch of the same strategy and world, other strategies at the same batch and world, and
    the same strategy on more workers."""
    same = [o for o in fits if (o.model, o.dataset, o.seq_len, o.precision, o.batch_mode)
            == (r.model, r.dataset, r.seq_len, r.precision, r.batch_mode)]  # fmt: skip
    hints = []
    smaller = [o.batch_size for o in same if o.strategy == r.strategy and o.batch_size
               < r.batch_size and (o.world_size, o.tp) == (r.world_size, r.tp)]  # fmt: skip
    if smaller:
        hints.append(f"fits at batch {max(smaller)}")
    others: dict[str, int] = {}  # another strategy -> the fewest workers it fits on
    for o in same:
        if o.strategy == r.strategy or o.batch_size != r.batch_size:
            continue
        if r.world_size <= o.world_size < others.get(o.strategy, 1 << 30):
            others[o.strategy] = o.world_size
    nearest_others = sorted(others.items(), key=lambda kv: (kv[1], kv[0]))[:2]
    hints += [f"with {s} at {workers(n)}" for s, n in nearest_others]
    wider = sorted({o.world_size for o in same if o.strategy == r.strategy
                    and o.batch_size == r.batch_size and o.world_size > r.world_size})  # fmt: skip
    if wider:
        hints.append(f"at {workers(wider[0])}")
    if not hints:
        return "no cell of this model in the matrix fits"
    text = ", or ".join(hints)
    return text if text.startswith("fits") else "fits " + text


def workers(n: int) -> str:
    return f"{n} worker{'s' * (n != 1)}"


# ----- the advice


def one_cell(study: StudyConfig, r: RunSpec, accelerator: str, **changes) -> RunSpec | None:
    """`r`'s cell with `changes`, as the study's rules build it; None where they refuse it
    (a knob the strategy has not, a batch that does not split over the workers)."""
    one = hf_models.expand(study).as_dict()
    one["matrix"] = {k: [changes.get(k, getattr(r, k))] for k in MATRIX_KEYS}
    if not r.seq_len:
        del one["matrix"]["seq_len"]  # an image data set
    one["faults"] = []
    try:
        runs, _ = build_runs(one, accelerator)
    except (ConfigError, ValueError):
        return None
    return next((s for s in runs if s.repeat == 0), None)


def variants(study: StudyConfig, r: RunSpec, accelerator: str) -> list[tuple[str, RunSpec]]:
    """(what changes, the cell with it) for each knob the study's rules allow on `r`."""
    tried = []
    if r.activation_checkpointing != "full":
        tried.append(("full activation checkpointing", {"activation_checkpointing": "full"}))
    for mode in ("optimizer", "params"):
        if r.offload != mode:
            tried.append((f"offload {mode}", {"offload": mode}))
    tried.append((f"{r.workers * 2} workers per node", {"workers": r.workers * 2}))
    batch = r.batch_size
    for _ in range(HALVINGS):
        batch //= 2
        if batch >= 1:
            tried.append((f"batch {batch}", {"batch_size": batch}))
    out = []
    for what, changes in tried:
        spec = one_cell(study, r, accelerator, **changes)
        if spec is not None:
            out.append((what, spec))
    return out


def advise(
    study: StudyConfig, cells: list[RunSpec], allowed: float, accelerator: str
) -> dict[str, str]:
    """{path: which knobs bring the cell under `allowed` bytes, each with its predicted GiB,
    and those that do not (of the batches, the largest that fits, or the smallest tried)}
    for each of `cells`, every variant predicted in one child."""
    tried = {r.path: variants(study, r, accelerator) for r in cells}
    every = {s.path: s for found in tried.values() for _, s in found}
    answers = predict(list(every.values()), accelerator) if every else {}
    return {r.path: said(tried[r.path], answers, allowed) for r in cells}


def said(tried: list[tuple[str, RunSpec]], answers: dict, allowed: float) -> str:
    """One cell's advice from its variants' answers."""
    if not tried:
        return "no knob of the matrix applies to it"
    under, over, batch_seen = [], [], False
    for what, spec in tried:
        a = answers[spec.path]
        if "error" in a:
            over.append(f"{what} (not predicted: {a['error']})")
            continue
        text = f"{what} ({need(a) / GIB:.3g} GiB)"
        is_batch = what.startswith("batch ")
        if need(a) <= allowed:
            if not (is_batch and batch_seen):
                under.append(text)
            batch_seen |= is_batch
        elif not is_batch or spec is tried[-1][1]:
            over.append(text)
    out = "predicted under the limit: " + ", ".join(under) if under else (
        "no single knob brings it under the limit as predicted"
    )  # fmt: skip
    return out + (f"; over it: {', '.join(over)}" if over else "")


# ----- trainscale fit


#: the keys that name a cell apart from its batch size
GROUP = tuple(k for k in MATRIX_KEYS if k != "batch_size")


def candidates(study: StudyConfig, template: RunSpec, max_batch: int, accelerator: str) -> list:
    """`template`'s cell at every batch size the study's rules accept, smallest first."""
    sizes = {b for k in range(20) for b in (2**k, 3 * 2**k) if b <= max_batch}
    sizes |= {b for b in study.matrix["batch_size"] if b <= max_batch}
    found = (one_cell(study, template, accelerator, batch_size=size) for size in sorted(sizes))
    return [r for r in found if r is not None]


@dataclass
class Found:
    """A group's answer: the largest fitting run and its predicted need (None: none fits),
    and the error of the first probe that could not be predicted."""

    run: RunSpec | None = None
    need: int | None = None
    error: str | None = None


def largest_fitting(tried: dict[tuple, list[RunSpec]], allowed: float, target: str) -> dict:
    """{group: Found}, by bisection in rounds. A probe whose prediction fails ends its
    group's search with the error: what cannot be predicted is neither promised nor called
    too big."""
    lo = {g: -1 for g in tried}  # index of the largest size known to fit
    hi = {g: len(runs) for g, runs in tried.items()}  # index of the smallest known not to
    need: dict[tuple, dict[int, int]] = {g: {} for g in tried}
    errors: dict[tuple, str] = {}
    while True:
        probes = {g: (lo[g] + hi[g]) // 2 for g in tried if hi[g] - lo[g] > 1 and g not in errors}
        if not probes:
            break
        answers = memory.predict([tried[g][i] for g, i in probes.items()], target)
        for g, i in probes.items():
            a = answers[tried[g][i].path]
            if "error" in a:
                errors[g] = f"batch {tried[g][i].batch_size}: {a['error']}"
                continue
            need[g][i] = memory.need(a)
            if need[g][i] <= allowed:
                lo[g] = i
            else:
                hi[g] = i
    return {g: Found(tried[g][lo[g]] if lo[g] >= 0 else None, need[g].get(lo[g]),
                     errors.get(g)) for g in tried}  # fmt: skip

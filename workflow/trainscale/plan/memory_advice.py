"""What would bring a cell over the memory limit under it, from predictions
(trainscale.plan.memory): the same cell with full activation checkpointing, with offload, on
twice the workers, and at smaller batches, each predicted as any cell is (a model of many
identical blocks is traced at a few of them and scaled, so the variants cost a few small
traces), and said with its GiB.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from trainscale.plan import hf_models
from trainscale.plan.matrix import ConfigError, build_runs
from trainscale.plan.runspec import MATRIX_KEYS, RunSpec

GIB = 2**30
#: halvings of the batch tried
HALVINGS = 3


def one_cell(config: dict, r: RunSpec, accelerator: str, **changes) -> RunSpec | None:
    """`r`'s cell with `changes`, as the study's rules build it; None where they refuse it
    (a knob the strategy has not, a batch that does not split over the workers)."""
    one = copy.deepcopy(hf_models.expand(config))
    one["matrix"] = {k: [changes.get(k, getattr(r, k))] for k in MATRIX_KEYS}
    if not r.seq_len:
        del one["matrix"]["seq_len"]  # an image data set
    one["faults"] = []
    try:
        runs, _ = build_runs(one, accelerator)
    except (ConfigError, ValueError):
        return None
    return next((s for s in runs if s.repeat == 0), None)


def variants(config: dict, r: RunSpec, accelerator: str) -> list[tuple[str, RunSpec]]:
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
        spec = one_cell(config, r, accelerator, **changes)
        if spec is not None:
            out.append((what, spec))
    return out


def advice(config: dict, cells: list[RunSpec], allowed: float, accelerator: str,
           predict: Callable, need: Callable) -> dict[str, str]:  # fmt: skip
    """{path: which knobs bring the cell under `allowed` bytes, each with its predicted GiB,
    and those that do not (of the batches, the largest that fits, or the smallest tried)}
    for each of `cells`, every variant predicted in one call of `predict`."""
    tried = {r.path: variants(config, r, accelerator) for r in cells}
    every = {s.path: s for found in tried.values() for _, s in found}
    answers = predict(list(every.values()), accelerator) if every else {}
    return {r.path: said(tried[r.path], answers, allowed, need) for r in cells}


def said(tried: list[tuple[str, RunSpec]], answers: dict, allowed: float, need: Callable) -> str:
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

"""The all-reduce benchmark's table (collectives.csv) and the communication model of every
DDP-family cell (communication.csv): predicted seconds per optimizer step from the measured bus
bandwidth, set against the measured step and its exposed communication. docs/methods.md
states the formulas."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from trainscale.analysis.cells import CELL, with_axes
from trainscale.measure import collectives
from trainscale.plan import catalog

#: collectives.csv: one row per (backend, workers, nodes, message size); a benchmark that
#: could not run is one row with status `failed`, its error and no size.
COLLECTIVE_COLUMNS = [
    "status",
    "error",
    "backend",
    "workers",
    "nodes",
    "world_size",
    "bytes",
    "iters",
    "p50_seconds",
    "p95_seconds",
    "algbw_bytes_per_second",
    "busbw_bytes_per_second",
    "busbw_p95_bytes_per_second",
]

#: DDP-family strategies -> traffic of one optimizer step in all-reduces of the gradient (v).
COMM_VOLUME = catalog.comm_volumes("torch.distributed")


def collectives_frame(paths: Iterable[str | Path]) -> pd.DataFrame:
    """collectives.csv from the benchmark's JSON files (trainscale.measure.collectives)."""
    rows = []
    for p in paths:
        rec = collectives.read(p)
        head = {k: rec[k] for k in ("backend", "workers", "nodes", "world_size")}
        head.update(status=rec.get("status", "ok"), error=rec.get("error"))
        if head["status"] != "ok":
            rows.append(head)
        for r in rec["sizes"]:
            rows.append({**head, "iters": len(r["seconds"]), **r})
    return pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)


def measured_collectives(coll: pd.DataFrame) -> pd.DataFrame:
    """The rows of collectives.csv that hold timings (not the benchmarks that failed)."""
    return coll[coll["status"] == "ok"] if "status" in coll and len(coll) else coll


def failed_collectives(coll: pd.DataFrame) -> pd.DataFrame:
    """One row per benchmark that could not run, with its error."""
    if "status" not in coll or not len(coll):
        return coll.iloc[0:0]
    return coll[coll["status"] != "ok"]


def busbw_at(table: pd.DataFrame, size: float) -> float:
    """Bus bandwidth at `size` bytes: linear in log2(size) between the measured sizes (the
    nearest end outside them)."""
    t = table.sort_values("bytes")
    x = np.log2(t["bytes"].to_numpy(dtype=float))
    return float(np.interp(np.log2(size), x, t["busbw_bytes_per_second"].to_numpy(dtype=float)))


def gradient_bytes(strategy: str, precision: str, params: float) -> float:
    """S: bytes of one gradient (half precision under DeepSpeed bf16/fp16, fp32 otherwise)."""
    half = strategy.startswith("deepspeed-") and precision in ("bf16", "fp16")
    return params * (2 if half else 4)


COMM_COLUMNS = [
    *CELL,
    "world_size",
    "backend",
    "params",
    "gradient_bytes",
    "allreduce_volume",
    "tp_bytes",
    "tp_message_bytes",
    "busbw_bytes_per_second",
    "predicted_comm_seconds",
    "steps_per_epoch",
    "measured_step_seconds",
    "comm_share",
    "efficiency",
    "network_bound_efficiency",
    "measured_compute_seconds",
    "measured_exposed_seconds",
    "exposed_share",
    "exposed_method",
    "note",
]


def communication_frame(
    scaling: pd.DataFrame, runs: pd.DataFrame, coll: pd.DataFrame
) -> pd.DataFrame:
    """communication.csv: the communication model of every DDP-family cell with N > 1
    (docs/methods.md states every formula)."""
    if not len(scaling) or not len(runs):
        return pd.DataFrame(columns=COMM_COLUMNS)
    scaling = with_axes(scaling, "")
    cells = scaling[
        scaling["strategy"].isin([*COMM_VOLUME, *catalog.TENSOR_PARALLEL])
        & (scaling["world_size"] > 1)
        & (scaling["ok"] > 0)
    ]
    ok = with_axes(runs[runs["status"] == "ok"])
    per_cell = ok.groupby([f"spec.{k}" for k in CELL], dropna=False).first()
    exposed = _exposed_by_cell(ok)
    rows = []
    for c in cells.itertuples(index=False):
        key = tuple(getattr(c, k) for k in CELL)
        r = per_cell.loc[key]
        n = int(c.world_size)
        backend = "nccl" if r.get("device.kind") == "cuda" else "gloo"
        params = float(r["model.params"])
        size = gradient_bytes(c.strategy, c.precision, params)
        volume, tp, dp = COMM_VOLUME.get(c.strategy, 0.0), int(c.tp), n
        traffic, tp_note = None, ""
        if c.strategy in catalog.TENSOR_PARALLEL:  # FSDP over dp of params / tp, TP over tp
            dp = n // tp
            volume = COMM_VOLUME["torch-fsdp"] if dp > 1 else 0.0
            size = gradient_bytes("torch-fsdp", c.precision, params / tp)
            sp = bool(r.get("tp.sequence_parallel", True))
            batch = int(r["spec.per_worker_batch_size"])
            traffic = tp_bytes(c.model, int(c.seq_len), batch, c.precision, sp)
            tp_note = (
                "tensor parallelism: activations by tp_bytes, busbw of the tp group read at "
                "the cell's workers × nodes"
                if traffic
                else f"no traffic model of {c.model}'s tensor parallelism (its widths are its "
                "own); FSDP's part only"
            )
        replicas = catalog.data_replicas(c.strategy, n, tp)
        steps = (int(r["data.train_samples"]) // replicas) // int(r["spec.per_worker_batch_size"])
        limit = r.get("spec.steps_per_epoch")
        if limit is not None and not pd.isna(limit):
            steps = min(steps, int(limit))
        step_s = c.steady_epoch_seconds_mean / steps
        row = {k: getattr(c, k) for k in CELL}
        row.update(
            world_size=n,
            backend=backend,
            params=params,
            gradient_bytes=size,
            allreduce_volume=volume,
            tp_bytes=traffic[0] if traffic else np.nan,
            tp_message_bytes=traffic[1] if traffic else np.nan,
            steps_per_epoch=steps,
            measured_step_seconds=step_s,
            efficiency=c.efficiency,
            note="",
            **exposed.get(key, {}),
        )
        if pd.notna(row.get("measured_exposed_seconds", np.nan)):
            row["exposed_share"] = row["measured_exposed_seconds"] / step_s
        same = (
            coll[
                (coll["backend"] == backend)
                & (coll["workers"] == c.workers)
                & (coll["nodes"] == c.nodes)
            ]
            if len(coll)
            else coll
        )
        sub = measured_collectives(same)
        if not len(sub):
            failed = failed_collectives(same)
            why = (
                f"its run failed: {str(failed['error'].iloc[0]).splitlines()[0]}"
                if len(failed)
                else "collectives.enabled false, or its run failed"
            )
            row["note"] = (
                f"no all-reduce benchmark for {backend}, {c.workers} workers × {c.nodes} nodes "
                f"({why})"
            )
            rows.append(row)
            continue
        bw = busbw_at(sub, size)
        t_comm = volume * collectives.bus_factor(dp) * size / bw if volume else 0.0
        if traffic:
            t_comm += collectives.bus_factor(tp) * traffic[0] / busbw_at(sub, traffic[1])
        t1 = c.baseline_steady_epoch_seconds
        ideal = t1 / n
        row.update(
            busbw_bytes_per_second=bw,
            predicted_comm_seconds=t_comm,
            comm_share=t_comm / step_s,
            network_bound_efficiency=ideal / (ideal + steps * t_comm),
        )
        notes = [tp_note] if tp_note else []
        notes += [f"no network-bound efficiency: {c.baseline_note}"] if pd.isna(t1) else []
        if size > sub["bytes"].max():
            notes.append(
                f"busbw at S read at {int(sub['bytes'].max())} bytes, the largest size measured "
                "(the benchmark was cut short by collectives.max_bytes)"
            )
        row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows, columns=COMM_COLUMNS)


def _exposed_by_cell(ok: pd.DataFrame) -> dict[tuple, dict]:
    """Per cell: mean no-sync step and exposed communication over its ok runs, and the method
    (metrics `communication.*`, trainscale/runners/torch/exposed.py)."""
    cols = ("communication.compute_seconds_per_step", "communication.exposed_seconds_per_step")
    if not len(ok) or cols[1] not in ok:
        return {}
    out = {}
    for key, g in ok.groupby([f"spec.{k}" for k in CELL], dropna=False):
        methods = g.get("communication.method", pd.Series(dtype=object)).dropna().unique()
        note = g.get("communication.note", pd.Series(dtype=object)).dropna().unique()
        out[key] = {
            "measured_compute_seconds": pd.to_numeric(g[cols[0]], errors="coerce").mean(),
            "measured_exposed_seconds": pd.to_numeric(g[cols[1]], errors="coerce").mean(),
            "exposed_method": ", ".join(map(str, methods))
            or ("not measured: " + str(note[0]) if len(note) else ""),
        }
    return out


# --------------------------------------------------------------------------------------------
# Tensor parallelism's traffic per optimizer step, for communication.csv: the
# activations the plan of trainscale/runners/torch/tp_plans.py moves inside every layer.
#
# Counted from the plan, in all-reduces of one activation A = b·T·C elements (b the rank's batch,
# T the sequence, C the width) over the tp group; an all-gather or a reduce-scatter of a full
# tensor of M elements moves half an all-reduce of M. Per optimizer step of L layers:
#
# - without sequence parallelism: (6L + 2)·A. Each block's forward all-reduces after the
#   attention's and the MLP's row-parallel projections (2); its backward all-reduces the input
#   gradient of each column-parallel linear (q, k, v and the MLP's first: 4). The embedding's
#   lookup all-reduces once forward, the head's input gradient once backward.
# - with sequence parallelism: (4L + 2.5)·A. Each block: an all-gather before and a
#   reduce-scatter after attention and MLP, forward and backward (8 halves); the embedding's
#   all-reduce plus an all-gather of its output gradient; the head's all-gather of its input and
#   reduce-scatter of that gradient.
# - both: the loss on logits split by vocabulary (runners/torch/tp_loss.py) all-reduces three
#   values per token in fp32 (the largest logit; then the sum of exponentials and the next id's
#   logit in one all-reduce): 3·b·T·4
#   bytes; the logits themselves are never gathered.
#
# tests/test_tensor_parallel.py checks these counts against DTensor's CommDebugMode. Elements
# are taken at the compute precision: 2 bytes under bf16, 4 in fp32 (autocast keeps some norm
# outputs in fp32: the bf16 figure is a lower bound). torch-fsdp-tp adds FSDP's traffic over its
# dp replicas: v = 1.5 of a gradient of params / tp elements of 4 bytes.

#: the all-reduces the cross-entropy on logits split by vocabulary runs per step (tp_loss)
LOSS_ALLREDUCES = 2
#: the fp32 values per token they carry (the largest logit, the sum of exponentials, the
#: next id's logit)
LOSS_VALUES = 3


def collectives_per_step(layers: int, sequence_parallel: bool) -> dict[str, int]:
    """The collectives one training step of a GPT of `layers` blocks runs over its tp group,
    by CommDebugMode's names (activations, and the loss's all-reduces)."""
    if sequence_parallel:
        return {"all_reduce": 1 + LOSS_ALLREDUCES, "all_gather_into_tensor": 4 * layers + 2,
                "reduce_scatter_tensor": 4 * layers + 1}  # fmt: skip
    return {"all_reduce": 6 * layers + 2 + LOSS_ALLREDUCES}


def activation_allreduces(layers: int, sequence_parallel: bool) -> float:
    """All-reduces of one activation b·T·C per step (the loss's apart)."""
    return 4 * layers + 2.5 if sequence_parallel else 6 * layers + 2.0


def tp_bytes(model: str, seq_len: int, batch: int, precision: str, sp: bool):
    """(all-reduce-equivalent bytes per step over the tp group, one activation's bytes) of a
    built-in GPT; None where `model` is not one (an own model's widths are not known)."""
    row = catalog.MODELS.get(model)
    if row is None or row.gpt is None:
        return None
    layers, _, width = row.gpt
    element = 2 if precision in ("bf16", "fp16") else 4
    activation = batch * seq_len * width * element
    loss = LOSS_VALUES * batch * seq_len * 4
    return activation_allreduces(layers, sp) * activation + loss, activation

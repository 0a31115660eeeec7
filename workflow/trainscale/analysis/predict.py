"""Predicted scaling: a step-time model fitted to the measured runs, extrapolated to world sizes
that were not measured, with bootstrap bands, and checked by leaving measured world sizes out.

Predictions are labelled (`basis` predicted) and written only to predictions.csv; they never
enter scaling.csv, the summary or the "fastest" answer. docs/methods.md ("Predicted scaling")
states the model, its fit, its bands and its check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis import aggregate
from trainscale.analysis.predict_network import Network, network
from trainscale.analysis.predict_overlap import fit_overlap
from trainscale.plan import catalog

#: Gradient traffic per optimizer step, in all-reduces of the gradient (v).
VOLUME = catalog.comm_volumes()
#: What a family shares: every matrix value but workers and nodes.
FAMILY = aggregate.BASELINE
PREDICTION_COLUMNS = [
    *(k for k in FAMILY if k != "precision"),
    "precision",
    "world_size",
    "nodes",
    "throughput_pred",
    "throughput_lo",
    "throughput_hi",
    "efficiency_pred",
    "basis",
    "assumptions",
]
CHECK_COLUMNS = [
    *FAMILY,
    "world_size",
    "nodes",
    "measured",
    "predicted",
    "lo",
    "hi",
    "error_pct",
    "in_band",
    "fitted_on",
    "note",
]
BOOTSTRAP = 200


# --------------------------------------------------------------------------------------------
# the measured runs, and the fit


def observations(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per ok run of a strategy the model covers (logical CPU devices left out): its
    family, N, nodes, per-worker batch, steady step seconds, no-sync compute, throughput, S."""
    if not len(runs):
        return pd.DataFrame()
    r = runs[(runs["status"] == "ok") & runs["spec.strategy"].isin(list(VOLUME))]
    if "device.logical" in r:
        r = r[~r["device.logical"].map(lambda v: v is True or str(v).lower() == "true")]
    if not len(r):
        return pd.DataFrame()
    r = aggregate.with_axes(r)
    d = pd.DataFrame({k: r[f"spec.{k}"] for k in FAMILY})
    d["world_size"] = r["spec.world_size"].astype(int)
    d["nodes"] = r["spec.nodes"].astype(int)
    d["workers"] = r["spec.workers"].astype(int)
    d["b"] = r["spec.per_worker_batch_size"].astype(float)
    # optimizer steps of an epoch as the runners count them (runners.common.steps_per_epoch:
    # the rank's shard over its batch, at most config steps_per_epoch)
    steps = (r["data.train_samples"].astype(int) // d["world_size"]) // d["b"].astype(int)
    if "spec.steps_per_epoch" in r:
        cap = pd.to_numeric(r["spec.steps_per_epoch"], errors="coerce")
        steps = steps.where(cap.isna(), np.minimum(steps, cap))
    steps = steps.where(steps >= 1)  # no step time without a step (no runner records one)
    d["t_step"] = r["steady_epoch_seconds"].astype(float) / steps
    col = "communication.compute_seconds_per_step"
    d["compute"] = pd.to_numeric(r[col], errors="coerce") if col in r else np.nan
    d["throughput"] = r["throughput"].astype(float)
    d["S"] = [
        aggregate.gradient_bytes(s, p, float(n))
        for s, p, n in zip(r["spec.strategy"], r["spec.precision"], r["model.params"], strict=True)
    ]
    return d[d["t_step"].notna()].reset_index(drop=True)


@dataclass(frozen=True)
class Fit:
    c0: float
    c1: float
    t_fixed: float
    overlap: float
    notes: tuple[str, ...]

    def step(self, strategy: str, n: int, nodes: int, b: float, size: float, net: Network,
             u: float = 0.0) -> float:  # fmt: skip
        return (
            self.c0
            + self.c1 * b
            + self.t_fixed
            + max(0.0, t_comm(strategy, n, nodes, size, net, u) - self.overlap)
        )


def t_comm(strategy: str, n: int, nodes: int, size: float, net: Network, u: float = 0.0) -> float:
    link = net.link(nodes)
    return 0.0 if link is None else VOLUME[strategy] * link.ring_seconds(n, size, u)


def comm_table(
    strategy: str, shapes: list[tuple[int, int]], size: float, net: Network, us: np.ndarray
) -> np.ndarray:
    """t_comm of each (N, nodes) shape (columns) at each benchmark reading u (rows)."""
    out = np.zeros((len(us), len(shapes)))
    for j, (n, k) in enumerate(shapes):
        link = net.link(k)
        if link is not None:
            out[:, j] = VOLUME[strategy] * link.ring_seconds_at(n, size, us)
    return out


def _arrays(obs: pd.DataFrame) -> dict:
    """One family's runs as numpy arrays (the bootstrap refits thousands of times)."""
    a = {k: obs[k].to_numpy(float) for k in ("world_size", "nodes", "b", "t_step", "compute")}
    a["strategy"], a["S"] = str(obs["strategy"].iloc[0]), float(obs["S"].iloc[0])
    return a


def fit_compute(b: np.ndarray, t: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(c0, c1, note of row 0) of t_compute(b) = c0 + c1·b for each row of t (resamples), from
    the observations w marks (N = 1 steps and no-sync computes at per-worker batches b, the
    same in every row)."""
    n = w.sum(axis=1)
    if not n.all():
        raise ValueError("no run measures computation (no N = 1 run, no no-sync compute)")
    values = np.unique(b[w.any(axis=0)])
    b = b[None, :]
    distinct = sum((w & (b == v)).any(axis=1) for v in values)
    mb, mt = (w * b).sum(1) / n, np.where(w, t, 0.0).sum(1) / n
    db, dt = np.where(w, b - mb[:, None], 0.0), np.where(w, t - mt[:, None], 0.0)
    var = (db * db).sum(1)
    c1 = (db * dt).sum(1) / np.where(var > 0, var, 1.0)  # least squares (polyfit, degree 1)
    c0 = mt - c1 * mb
    bw = np.where(w, b, 0.0)
    through_0 = (bw * np.where(w, t, 0.0)).sum(1) / (bw * bw).sum(1)
    one_b = distinct < 2
    note_of = [
        (one_b, f"compute measured at one per-worker batch ({values[0]:g}): assumed "
         "proportional to it"),
        (c0 < 0, "compute fit through 0 (intercept < 0)"),
        (c1 < 0, "compute constant in the batch (fitted slope < 0)"),
    ]  # fmt: skip
    proportional = one_b | (c0 < 0)
    constant = ~proportional & (c1 < 0)
    c0, c1 = (
        np.where(proportional, 0.0, np.where(constant, mt, c0)),
        np.where(one_b, mt / values[0], np.where(c0 < 0, through_0, np.where(constant, 0.0, c1))),
    )
    bs = ", ".join(f"{v:g}" for v in values)
    note = next((n for m, n in note_of if m[0]), f"compute linear in the per-worker batch, "
                f"fitted at b = {bs}")  # fmt: skip
    return c0, c1, note


def fits(
    a: dict, picks: np.ndarray, us: np.ndarray, net: Network
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """(c0, c1, t_fixed, overlap) of the model fitted to each resample picks[i] (indices of
    a's runs, every row with the same world sizes in the same places) with the benchmark read
    at us[i], and the notes of row 0 (docs/methods.md, "Predicted scaling")."""
    ws, nodes, b = (a[k][picks[0]] for k in ("world_size", "nodes", "b"))
    t_step, comp = a["t_step"][picks], a["compute"][picks]
    one = (ws == 1)[None, :]
    use = one | ((ws > 1)[None, :] & ~np.isnan(comp))
    c0, c1, note = fit_compute(b, np.where(one, t_step, comp), use)
    multi = ws > 1
    zero = np.zeros(len(picks))
    if not multi.any():
        return c0, c1, zero, zero, (note, "no multi-worker run: t_fixed = overlap = 0")
    n, k, bm = ws[multi], nodes[multi], b[multi]
    cm = comp[:, multi]
    cm = np.where(np.isnan(cm), c0[:, None] + c1[:, None] * bm, cm)
    e = np.maximum(0.0, t_step[:, multi] - cm)  # (resamples, runs)
    keys, first, inverse = np.unique(n * 1e6 + k, return_index=True, return_inverse=True)
    shapes = [(int(n[i]), int(k[i])) for i in first]  # (N, nodes) in the order of `keys`
    tcs = comm_table(a["strategy"], shapes, a["S"], net, us)
    if len(shapes) == 1:
        d = e.mean(axis=1) - tcs[:, 0]
        how = "one multi-worker world size: t_fixed and overlap not separable, "
        fixed, overlap = np.maximum(d, 0.0), np.maximum(-d, 0.0)
        return c0, c1, fixed, overlap, (note, how + ("overlap = 0" if d[0] >= 0 else "t_fixed = 0"))
    # The hidden time takes one value per (N, nodes) shape, so the sums over runs reduce to
    # sums over shapes of each shape's count, Σe and Σe² (not over runs).
    members = [inverse.ravel() == j for j in range(len(shapes))]
    count = np.array([m.sum() for m in members], dtype=float)
    sum_e = np.stack([e[:, m].sum(axis=1) for m in members], axis=1)  # (resamples, shapes)
    sum_e2 = np.stack([(e[:, m] ** 2).sum(axis=1) for m in members], axis=1)
    t_fixed, overlap = fit_overlap(tcs, count, sum_e, sum_e2)
    how = f"t_fixed and overlap fitted over {len(shapes)} multi-worker world sizes"
    return c0, c1, t_fixed, overlap, (note, how)


def fit(obs: pd.DataFrame | dict, net: Network, u: float = 0.0) -> Fit:
    """The model's parameters from one family's runs (docs/methods.md, "Predicted scaling")."""
    a = _arrays(obs) if isinstance(obs, pd.DataFrame) else obs
    picks = np.arange(len(a["world_size"]))[None, :]
    c0, c1, t_fixed, overlap, notes = fits(a, picks, np.array([u]), net)
    return Fit(float(c0[0]), float(c1[0]), float(t_fixed[0]), float(overlap[0]), notes)


# --------------------------------------------------------------------------------------------
# predictions, bands and the leave-one-out check


def _groups(a: dict) -> list[np.ndarray]:
    """Indices of the runs of each measured (N, nodes)."""
    key = a["world_size"] * 1e6 + a["nodes"]
    return [np.flatnonzero(key == v) for v in np.unique(key)]


def _scatter(a: dict, groups: list[np.ndarray]) -> np.ndarray:
    """Relative deviations of single runs' step times from their cell's mean (cells with two
    or more runs): how far one measurement falls from the mean; [0] without repeats."""
    dev = [a["t_step"][g] / a["t_step"][g].mean() - 1 for g in groups if len(g) > 1]
    return np.concatenate(dev) if dev else np.zeros(1)


def band(
    a: dict, net: Network, targets: list[tuple[int, int, float]], seed: int = 0
) -> tuple[Fit, np.ndarray, np.ndarray, np.ndarray]:
    """(point fit, step seconds, lo, hi) at targets [(N, nodes, b)]: bootstrap percentiles of
    a run's step time, widened to contain the point prediction. Every resample is drawn from
    the random stream of the study's seed and all are fitted in one array operation. `a`:
    one family's runs as `_arrays`."""
    strategy, size = a["strategy"], a["S"]
    point = fit(a, net)
    pred = np.array([point.step(strategy, n, k, b, size, net) for n, k, b in targets])
    rng = np.random.default_rng(seed)
    groups = _groups(a)
    scatter = _scatter(a, groups)
    us = rng.uniform(size=BOOTSTRAP)
    picks = np.concatenate([g[rng.integers(0, len(g), (BOOTSTRAP, len(g)))] for g in groups], 1)
    noise = 1 + scatter[rng.integers(0, len(scatter), (BOOTSTRAP, len(targets)))]
    c0, c1, t_fixed, overlap, _ = fits(a, picks, us, net)
    comm = comm_table(strategy, [(n, k) for n, k, _ in targets], size, net, us)
    b = np.array([t[2] for t in targets])
    step = c0[:, None] + c1[:, None] * b + t_fixed[:, None]
    draws = (step + np.maximum(0.0, comm - overlap[:, None])) * noise
    lo = np.minimum(np.percentile(draws, 2.5, axis=0), pred)
    hi = np.maximum(np.percentile(draws, 97.5, axis=0), pred)
    return point, pred, lo, hi


_COLUMNS = ("world_size", "nodes", "b", "t_step", "compute")


def _per_worker(batch: int, mode: str, n: int) -> float:
    return batch / n if mode == "global" else float(batch)


def _global(batch: int, mode: str, n: int) -> float:
    return float(batch) if mode == "global" else float(batch * n)


def family_predictions(
    obs: pd.DataFrame, net: Network, world_sizes: list[int]
) -> tuple[list[dict], list[str]]:
    """predictions.csv rows of one family: measured world sizes as measured, the rest
    predicted; and notes on world sizes left out."""
    key = {k: obs[k].iloc[0] for k in FAMILY}
    batch, mode, strategy = int(key["batch_size"]), str(key["batch_mode"]), str(key["strategy"])
    measured = {}
    for (n, k), g in obs.groupby(["world_size", "nodes"]):
        mean, _, ci = aggregate.ci95(g["throughput"].tolist())
        measured[int(n)] = (int(k), mean, 0.0 if math.isnan(ci) else ci, len(g))
    skipped = [n for n in world_sizes if mode == "global" and batch % n]
    wanted = sorted({*measured, *(n for n in world_sizes if n not in skipped)})
    todo = [n for n in wanted if n not in measured]
    targets = [(n, math.ceil(n / net.gpus_per_node), _per_worker(batch, mode, n)) for n in todo]
    if 1 not in measured:
        targets.append((1, 1, _per_worker(batch, mode, 1)))
    point, step, lo, hi = band(_arrays(obs), net, targets)
    x1 = measured[1][1] if 1 in measured else _global(batch, mode, 1) / step[-1]
    rows = []
    for n in wanted:
        row = {**key, "world_size": n}
        if n in measured:
            k, mean, ci, count = measured[n]
            row.update(
                nodes=k, throughput_pred=mean, throughput_lo=max(0.0, mean - ci),
                throughput_hi=mean + ci,
                efficiency_pred=mean / (n * x1), basis="measured",
                assumptions=f"mean of {count} ok run(s); band = 95% CI over repeats",
            )  # fmt: skip
        else:
            i = todo.index(n)
            g = _global(batch, mode, n)
            k = targets[i][1]
            link = net.link(k)
            assume = [
                *point.notes,
                *net.notes,
                f"{n} workers on {k} node(s) of {net.gpus_per_node}",
                f"links: {link.source}" if link else "no link model",
                f"v = {VOLUME[strategy]:g}; t_fixed = {point.t_fixed * 1e3:.3g} ms, "
                f"overlap = {point.overlap * 1e3:.3g} ms",
            ]
            row.update(
                nodes=k, throughput_pred=g / step[i], throughput_lo=g / hi[i],
                throughput_hi=g / lo[i], efficiency_pred=g / step[i] / (n * x1),
                basis="predicted", assumptions="; ".join(assume),
            )  # fmt: skip
        if 1 not in measured:
            row["assumptions"] += "; efficiency against the model's N = 1 throughput (not measured)"
        rows.append(row)
    notes = [
        f"{strategy} batch {batch} global: no prediction at N = {n} (the batch does not split "
        "over N workers)"
        for n in skipped
    ]
    return rows, notes


def family_check(obs: pd.DataFrame, net: Network) -> list[dict]:
    """prediction_check.csv rows of one family: each measured world size N > 1 predicted by the
    model fitted without its runs (on the family's arrays: a frame masked per held-out world
    size was most of the predictions' time at 10,000 runs)."""
    key = {k: obs[k].iloc[0] for k in FAMILY}
    batch, mode = int(key["batch_size"]), str(key["batch_mode"])
    a = _arrays(obs)
    ws, nodes, throughput = a["world_size"], a["nodes"], obs["throughput"].to_numpy(float)
    rows = []
    for n, k in sorted({(int(n), int(k)) for n, k in zip(ws, nodes, strict=True) if n > 1}):
        held = (ws == n) & (nodes == k)
        measured = throughput[held & ~np.isnan(throughput)]
        row = {**key, "world_size": n, "nodes": k}
        row["measured"] = float(measured.mean()) if len(measured) else math.nan
        row["fitted_on"] = " ".join(map(str, sorted({int(v) for v in ws[~held]})))
        if held.all():
            row["note"] = f"check could not be made: N = {n} is the only world size measured"
            rows.append(row)
            continue
        rest = {c: v[~held] if isinstance(v, np.ndarray) else v for c, v in a.items()}
        try:
            point, step, lo, hi = band(rest, net, [(n, k, _per_worker(batch, mode, n))])
        except ValueError as e:
            row.update(note=f"check could not be made: {e}")
            rows.append(row)
            continue
        g = _global(batch, mode, n)
        pred, p_lo, p_hi = g / step[0], g / hi[0], g / lo[0]
        measured = row["measured"]
        row.update(
            predicted=pred, lo=p_lo, hi=p_hi, error_pct=100 * (pred - measured) / measured,
            in_band=bool(p_lo <= measured <= p_hi), note="; ".join(point.notes),
        )  # fmt: skip
        rows.append(row)
    return rows


def predict_study(
    runs: pd.DataFrame, coll: pd.DataFrame, predict_cfg: dict
) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(predictions.csv, prediction_check.csv, notes) of a study."""
    obs = observations(runs)
    notes: list[str] = []
    pred_rows, check_rows = [], []
    if len(obs):
        net = network(coll, predict_cfg, int(obs["workers"].max()))
        world_sizes = [int(n) for n in predict_cfg.get("world_sizes") or DEFAULT_WORLD_SIZES]
        for _, fam in obs.groupby(FAMILY, sort=True, dropna=False):
            try:
                rows, why = family_predictions(fam, net, world_sizes)
            except ValueError as e:
                notes.append(f"{fam['strategy'].iloc[0]}: no prediction ({e})")
                continue
            pred_rows += rows
            notes += why
            check_rows += family_check(fam, net)
    notes += [f"{s}: no prediction ({why})" for s, why in not_covered(runs)]
    pred = pd.DataFrame(pred_rows, columns=PREDICTION_COLUMNS)
    check = pd.DataFrame(check_rows, columns=CHECK_COLUMNS)
    return pred, check, notes


def not_covered(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """(strategy, why) for each strategy with ok runs that the model does not predict because
    of what it is (the tensor-parallel ones), for the report beside the predictions."""
    if not len(runs):
        return []
    ok = set(runs.loc[runs["status"] == "ok", "spec.strategy"])
    return [(s, NO_TP_PREDICTION) for s in catalog.TENSOR_PARALLEL if s in ok]


#: Why the tensor-parallel strategies get no predicted scaling.
NO_TP_PREDICTION = (
    "the model extrapolates a data-parallel step: compute of a per-worker batch plus a gradient "
    "all-reduce. Tensor parallelism splits each layer's compute over tp ranks (its efficiency "
    "falls with the narrower matrices) and puts activation traffic on the critical path of "
    "every layer; its predicted traffic per step is in communication.csv"
)


#: predict.world_sizes by default: 4 … 512, powers of 2.
DEFAULT_WORLD_SIZES = [2**k for k in range(2, 10)]


def fitted_parameters(runs: pd.DataFrame, coll: pd.DataFrame, predict_cfg: dict) -> list[dict]:
    """Per family the fitted model (seconds): c0, c1 (per sample), t_fixed, overlap and the
    notes on how they were fitted: what a scaling card carries to another cluster."""
    obs = observations(runs)
    if not len(obs):
        return []
    net = network(coll, predict_cfg, int(obs["workers"].max()))
    out = []
    for _, fam in obs.groupby(FAMILY, sort=True, dropna=False):
        try:
            f = fit(fam, net)
        except ValueError:
            continue
        key = {k: fam[k].iloc[0] for k in FAMILY}
        out.append({**{k: v.item() if hasattr(v, "item") else v for k, v in key.items()},
                    "c0": f.c0, "c1": f.c1, "t_fixed": f.t_fixed, "overlap": f.overlap,
                    "notes": list(f.notes)})  # fmt: skip
    return out

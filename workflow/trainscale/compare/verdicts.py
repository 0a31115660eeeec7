"""Compare two studies (or two clusters' scaling cards): a regression check CI can run.

    python -m trainscale.compare BASE NEW [--threshold 0.05] [--html FILE] [--json FILE]
    python -m trainscale.compare --reference references.yaml STUDY

BASE and NEW are each a study's results folder, any folder of metrics.json files gathered from
elsewhere, or a scaling-card.json; every folder is first turned into its scaling card
(trainscale.compare.card), so studies and cards are compared alike. References are checked by
trainscale.compare.references. Definitions:

- cell: every matrix value but the repeat (strategy, model, dataset, scale, batch_size,
  batch_mode, workers, nodes, precision); cells of BASE and NEW are matched by these values.
- throughput ratio: NEW / BASE of the geometric means of the cells' ok repeats, i.e.
  exp(mean ln x_new − mean ln x_base), x the run throughput of trainscale.compare.card.
- 95% CI from steps and repeats (the default, --ci steps): the model of docs/methods.md's
  "confidence interval" on log throughput (ȳ, each run's within-run variance w̄ from its batch
  means, the run-to-run variance of the cell's pool of strata), with the run-to-run variance
  pooled over BOTH studies: the two are alike by construction when compared on one cluster (the
  same strategy and configuration, run the same way), so s² = (ν_b s²_b + ν_n s²_n) / (ν_b +
  ν_n) with ν_b + ν_n degrees of freedom, σ_a² likewise, and exp(d ± t(0.975, ν) · √V), d =
  ȳ_new − ȳ_base, V = (1/n_b + 1/n_n) σ_a² + w̄_b/n_b + w̄_n/n_n, ν Satterthwaite's (s² with its
  pooled df, each w̄ with its own), floored. Where the two s² are not alike (an F test tells
  them apart at 1 %: e.g. two clusters) they are not pooled: each side keeps its study's Var(ȳ)
  and ν is Welch–Satterthwaite's, and the row says so; so does a card made before the pooled
  parts. A two-cell study of 2 repeats has 2 df of its own, 4 pooled. Where either side's cell
  lacks the model (records or a card made before batch means; tf-ps) the bootstrap below is used
  and the row says so.
- 95% CI by bootstrap (--ci bootstrap): the 2.5th and 97.5th percentiles of
  the log ratio over 10,000 resamplings (with replacement, fixed seed) of each side's repeats.
  With 2 repeats a side it spans every pairwise ratio, min(new)/max(base) to max(new)/min(base):
  slower then means every NEW repeat was slower than every BASE repeat.
- 95% CI by Welch (--ci welch): mean log difference ± t(0.975, ν) · √(s²_base/n_base +
  s²_new/n_new), with Welch–Satterthwaite's ν; with 2 repeats a side ν ≤ 2 and t ≥ 4.3, so it
  flags only large, steady changes.
- verdict: not comparable when the cell is missing on one side, has no ok run there (failed,
  oom, timeout or diverged: a run whose loss went unsound is never compared), or has no
  interval (a single repeat outside the model: no CI); slower when the CI's upper end is below 1
  and the ratio below 1 − threshold; faster when the CI's lower end is above 1 and the ratio
  above 1 + threshold; same otherwise.
- accuracy change: mean test accuracy NEW − BASE, in percentage points.
- peak memory change: NEW / BASE − 1 of the mean peak device memory where both sides have it,
  of the mean peak host RSS otherwise (both the max over ranks).
- environment diff: every machine entry of the cards (hosts, CPU/GPU models, framework, CUDA,
  NCCL and driver versions, trainscale) and every study-wide config key whose values differ.
- cost ratio (with prices: `--cost FILE`, a YAML file with a `cost:` section as a study config
  has, or the study's own `cost` for `compare_with`): NEW / BASE of the geometric means of
  the ok repeats' cost per million tokens or samples, each repeat's N · 10⁶ / (x · u) / 3600
  device-hours (u: seq_len tokens on token data, else 1) at the price of its side's device
  (docs/methods.md defines cost per million). Its CI is the throughput ratio's,
  inverted and times the ratio of the two prices. Cost verdict: dearer when the CI's lower
  end is above 1 and the ratio above 1 + threshold, cheaper the mirror image, same
  otherwise; not comparable where a side's device has no price (its reason names why).
- exit status: 1 when any cell is slower or dearer, 0 otherwise; 2 on bad input, with the
  error named.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from trainscale.analysis.aggregate import CELL
from trainscale.analysis.interval import combined, t_quantile
from trainscale.compare import card as ts_card
from trainscale.compare.cellrow import CellRow, Comparison
from trainscale.compare.machine import environment_diff
from trainscale.compare.sides import Side, StepModel
from trainscale.plan.prices import CPU_KEY, Prices
from trainscale.plan.runspec import OUT_OF_PATH

#: --ci: how the ratio's 95% CI is made (the module docstring defines each).
METHODS = ("steps", "bootstrap", "welch")
#: The note of a cell whose CI fell back from steps and repeats to the bootstrap.
FALLBACK = "CI over repeats only (bootstrap): a side's records or card lack step times"
#: The note of a cell whose two studies' run-to-run variances were not pooled.
NOT_POOLED = "run-to-run spread not pooled: the two studies' differ (F test at 1 %)"
#: The note of a cell whose card lacks the parts to pool (made before them).
OLD_CARD = "run-to-run spread not pooled: a card made before its parts were recorded"
#: The two studies' run-to-run variances are pooled unless an F test tells them apart here.
ALIKE = 0.01
RESAMPLES = 10_000


class CompareError(ValueError):
    """Bad input: a missing folder, a folder without metrics, a broken card or reference file."""


# --------------------------------------------------------------------------------------------
# statistics


def log_ratio_ci(base: list[float], new: list[float], method: str) -> tuple[float, float, float]:
    """(ratio, CI low, CI high) of NEW / BASE; both lists hold ≥ 2 positive throughputs."""
    a, b = np.log(np.asarray(base, float)), np.log(np.asarray(new, float))
    d = b.mean() - a.mean()
    if method == "welch":
        from scipy.special import stdtrit

        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        se = math.sqrt(va + vb)
        if se == 0:
            return math.exp(d), math.exp(d), math.exp(d)
        nu = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
        h = float(stdtrit(nu, 0.975)) * se
        return math.exp(d), math.exp(d - h), math.exp(d + h)
    rng = np.random.default_rng(0)
    ma = a[rng.integers(0, len(a), (RESAMPLES, len(a)))].mean(axis=1)
    mb = b[rng.integers(0, len(b), (RESAMPLES, len(b)))].mean(axis=1)
    lo, hi = np.quantile(mb - ma, [0.025, 0.975])
    return math.exp(d), math.exp(lo), math.exp(hi)


def log_ratio_model(base: StepModel, new: StepModel) -> tuple[float, float, float, str]:
    """(ratio, CI low, CI high, note) of NEW / BASE from each side's model, the two studies'
    run-to-run variance pooled where alike (see the docstring); the note says why not where it
    was not."""
    d = new.log_mean - base.log_mean
    note = "" if base.poolable and new.poolable else OLD_CARD
    if not note and not alike(base, new):
        note = NOT_POOLED
    if note:
        var = base.log_var + new.log_var
        den = base.log_var**2 / base.df + new.log_var**2 / new.df
        nu = var**2 / den if den > 0 else min(base.df, new.df)
    else:
        var, nu = pooled_variance(base, new)
    if var <= 0:
        return math.exp(d), math.exp(d), math.exp(d), note
    h = float(t_quantile(nu)) * math.sqrt(var)
    return math.exp(d), math.exp(d - h), math.exp(d + h), note


def pooled_variance(base: StepModel, new: StepModel) -> tuple[float, float]:
    """(Var(d), ν) with the two studies' run-to-run variances pooled (both `poolable`)."""
    nu_b, nu_n = base.pooled_df, new.pooled_df
    pool = lambda k: (nu_b * getattr(base, k) + nu_n * getattr(new, k)) / (nu_b + nu_n)  # noqa: E731
    within = [(side.within_run_var / side.n, side.within_run_df) for side in (base, new)]
    v, df = combined(1 / base.n + 1 / new.n, pool("between_run_var"), pool("pooled_run_var"),
                     nu_b + nu_n, within)  # fmt: skip
    return float(v), float(df)


def alike(base: StepModel, new: StepModel) -> bool:
    """Whether the two studies' run-to-run variances s² may be pooled: an F test of their
    ratio, two-sided, does not tell them apart at ALIKE."""
    from scipy.special import fdtr

    sb, sn = base.pooled_run_var, new.pooled_run_var
    if sb <= 0 or sn <= 0:
        return sb == sn
    p = float(fdtr(new.pooled_df, base.pooled_df, sn / sb))
    return 2 * min(p, 1 - p) >= ALIKE


def verdict(ratio: float, lo: float, hi: float, threshold: float) -> str:
    if hi < 1 and ratio < 1 - threshold:
        return "slower"
    if lo > 1 and ratio > 1 + threshold:
        return "faster"
    return "same"


# --------------------------------------------------------------------------------------------
# cells


def cells_of(card: dict) -> dict[tuple, Side]:
    """cell key (CELL order) -> its point in the card."""
    out = {}
    for g in card["scaling"]:
        for p in g["by_n"]:
            # a key a card made before its axis lacks: that axis's default (seq_len 0, none)
            values = {**{k: g.get(k, OUT_OF_PATH.get(k, 0)) for k in ts_card.GROUP},
                      "workers": p["workers"]}  # fmt: skip
            values["nodes"] = p["nodes"]
            values["tp"] = p.get("tp", 1)  # cards made before the axis: no tensor parallelism
            out[tuple(values[k] for k in CELL)] = Side.of(p)
    return out


def label(key: tuple) -> str:
    """`torch-ddp seed-small digits N=2 batch 64 global scale 1 fp32`: the strategy first."""
    c = dict(zip(CELL, key, strict=True))
    n = c["workers"] * c["nodes"]
    shape = f" ({c['workers']}×{c['nodes']})" if c["nodes"] != 1 else ""
    shape += f" tp {c['tp']}" if c.get("tp", 1) > 1 else ""
    return (
        f"{c['strategy']} {c['model']} {c['dataset']} N={n}{shape} batch {c['batch_size']} "
        f"{c['batch_mode']} scale {c['scale']} {c['precision']}"
    )


def _change(new: float | None, base: float | None) -> float | None:
    return None if new is None or base is None or base == 0 else new / base - 1


def compare_cell(
    key: tuple, b: Side | None, n: Side | None, threshold: float, method: str
) -> CellRow:
    """A cell's row of the comparison: its throughput ratio, CI and verdict, or why it is not
    comparable, and the accuracy and memory changes beside them."""
    row = CellRow(
        cell=dict(zip(CELL, key, strict=True)),
        label=label(key),
        base=b.summary() if b else None,
        new=n.summary() if n else None,
        **side_changes(b, n),
        notes=sorted({*(b.notes if b else []), *(n.notes if n else [])}),
    )
    if why := not_comparable(b, n):
        return replace(row, reason=why)
    models = (b.model, n.model) if method == "steps" else (None, None)
    if None not in models:
        ratio, lo, hi, note = log_ratio_model(*models)
        ci, notes = "steps", [*row.notes, note] if note else row.notes
    else:
        for side, p in (("BASE", b), ("NEW", n)):
            if p.n < 2:
                return replace(row, reason=f"single repeat in {side}: no confidence interval")
        ci = "bootstrap" if method == "steps" else method
        notes = [*row.notes, FALLBACK] if method == "steps" else row.notes
        ratio, lo, hi = log_ratio_ci(b.values, n.values, ci)
    return replace(row, ratio=ratio, ci_low=lo, ci_high=hi, ci=ci, notes=notes,
                   verdict=verdict(ratio, lo, hi, threshold))  # fmt: skip


def side_changes(b: Side | None, n: Side | None) -> dict[str, Any]:
    """The accuracy change (points) and the peak memory change (device where both sides have
    it, host RSS otherwise), None where a side is missing."""
    changes = {"accuracy_change": None, "memory_change": None, "memory": None}
    if b is None or n is None:
        return changes
    if b.test_accuracy is not None and n.test_accuracy is not None:
        changes["accuracy_change"] = n.test_accuracy - b.test_accuracy
    if b.peak_device_bytes and n.peak_device_bytes:
        changes["memory_change"] = _change(n.peak_device_bytes, b.peak_device_bytes)
        changes["memory"] = "device"
    else:
        changes["memory_change"] = _change(n.peak_host_rss_bytes, b.peak_host_rss_bytes)
        changes["memory"] = "host RSS"
    return changes


def not_comparable(b: Side | None, n: Side | None) -> str:
    """Why a cell is not comparable for want of a side or of an ok run ("" where both have)."""
    for side, p in (("BASE", b), ("NEW", n)):
        if p is None:
            return f"missing in {side}"
        if p.ok == 0:
            what = "diverged" if set(p.statuses) == {"diverged"} else "failed"
            return f"{what} in {side} ({p.by_status()})"
    return ""


def device_hour_price(p: Side, prices: Prices) -> tuple[float | None, str]:
    """(the price of one of the point's devices for an hour, "") or (None, why there is none):
    a cpu-core price × threads_per_worker on CPU."""
    if p.device is None:
        return None, "the card records no device (made before cards did)"
    key, why = prices.match(p.device.kind, p.device.name)
    if key is None:
        return None, why
    threads = p.device.threads_per_worker or 1
    return prices.device_hour[key] * (threads if key == CPU_KEY else 1), ""


def compare_cost(
    row: CellRow, b: Side | None, n: Side | None, prices: Prices | None, threshold: float
) -> CellRow:
    """A cell's row with its cost ratio, CI and verdict (the module docstring defines them):
    from the row's throughput ratio and the two prices."""
    return replace(row, **cost_fields(row, b, n, prices, threshold))


def cost_fields(
    row: CellRow, b: Side | None, n: Side | None, prices: Prices | None, threshold: float
) -> dict[str, Any]:
    """The cost fields of a cell's row; all None without prices."""
    none = {"cost_ratio": None, "cost_ci_low": None, "cost_ci_high": None, "cost_verdict": None,
            "cost_reason": ""}  # fmt: skip
    if prices is None:
        return none
    if row.ratio is None:
        return {**none, "cost_verdict": "not comparable", "cost_reason": row.reason}
    (pb, why_b), (pn, why_n) = device_hour_price(b, prices), device_hour_price(n, prices)
    if pb is None or pn is None or pb == 0:
        side, why = ("BASE", why_b) if pb is None else ("NEW", why_n)
        why = f"no price in {side}: {why or 'its price is 0'}"
        return {**none, "cost_verdict": "not comparable", "cost_reason": why}
    # cost ∝ N · price / x, and N is the same on both sides of a cell
    k = pn / pb
    ratio, lo, hi = k / row.ratio, k / row.ci_high, k / row.ci_low
    higher = {"slower": "cheaper", "faster": "dearer", "same": "same"}  # verdict's words for up
    said = higher[verdict(ratio, lo, hi, threshold)]
    return {"cost_ratio": ratio, "cost_ci_low": lo, "cost_ci_high": hi, "cost_verdict": said,
            "cost_reason": ""}  # fmt: skip


# --------------------------------------------------------------------------------------------
# the whole comparison


def load(source: str | Path, side: str) -> dict:
    """A card from BASE or NEW (folder or card file); CompareError naming the side otherwise."""
    path = Path(source)
    if not path.exists():
        raise CompareError(f"{side} {source}: no such folder or file")
    try:
        return ts_card.load(path)
    except ts_card.CardError as e:
        raise CompareError(f"{side} {e}") from None


def prices_from(path: str | Path) -> Prices:
    """The prices of a YAML file's `cost:` section (`--cost FILE`, e.g. a study config);
    CompareError naming the file where there are none."""
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise CompareError(f"--cost {path}: {e}") from None
    prices = Prices.from_config(config if isinstance(config, dict) else {})
    if prices is None:
        raise CompareError(
            f"--cost {path}: no cost.device_hour prices in it (give e.g. "
            f"`cost: {{device_hour: {{H100: 2.49, {CPU_KEY}: 0.04}}, currency: USD}}`)"
        )
    return prices


def describe(card: dict) -> dict:
    runs = sum(p["runs"] for g in card["scaling"] for p in g["by_n"])
    return {"source": card["source"], "study": card["study"], "runs": runs}


def compare(
    base: dict,
    new: dict,
    threshold: float = 0.05,
    method: str = "steps",
    prices: Prices | None = None,
) -> Comparison:
    """The comparison of two cards (the module docstring defines every figure); with
    `prices`, each cell's cost too."""
    cb, cn = cells_of(base), cells_of(new)
    keys = sorted(set(cb) | set(cn), key=lambda k: tuple(map(str, k)))
    rows = [
        compare_cost(compare_cell(k, cb.get(k), cn.get(k), threshold, method), cb.get(k),
                     cn.get(k), prices, threshold)
        for k in keys
    ]  # fmt: skip
    return Comparison(
        mode="compare",
        base=describe(base),
        new=describe(new),
        threshold=threshold,
        ci=method,
        currency=prices.currency if prices else None,
        cells=[row.to_json() for row in rows],
        environment=environment_diff(base, new),
        failures={"base": base["failures"], "new": new["failures"]},
    )


def compare_paths(base: str | Path, new: str | Path, **kw) -> Comparison:
    return compare(load(base, "BASE"), load(new, "NEW"), **kw)

"""`trainscale tune` (trainscale.tune, workflow/rules/tune.smk, docs/tune.md): round 0's search
space, the elimination rule on simulated cells and on synthetic records at the default noise,
the budget, a failed run, best.yaml as a study, and one real tune of two cells through the
workflow and the `trainscale tune` command."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml
from test_interval import PHI, SIGMA_A, STEP_CV

from trainscale import data
from trainscale.measure import metrics, steptimes
from trainscale.plan import overlay
from trainscale.plan.matrix import build_runs, repeat_count, repeat_range
from trainscale.plan.runspec import ConfigError
from trainscale.runners.common import evaluates
from trainscale.tune import budget, cli, records, results, rule, space
from trainscale.tune.space import MATRIX_KEYS

from conftest import PYTHON, ROOT, load_yaml, run_env, snakemake, validated

#: Simulated tunes per elimination check: a rate near 95 % known to about ±1 point.
TUNES = 400
TWENTY = math.log(0.8)  # a cell 20 % slower


def study(*strategies: str, **extra) -> dict:
    """A validated study of `strategies` on one worker, seed-small on digits."""
    m = {"strategy": list(strategies), "model": ["seed-small"], "dataset": ["digits"],
         "workers": [1], "batch_size": [64]}  # fmt: skip
    m.update(extra.pop("matrix", {}))
    return validated({"study": "t", "repeats": extra.pop("repeats", 2), "matrix": m, **extra})


def plan(cfg: dict, predicted: dict | None = None) -> space.Space:
    runs, dropped = build_runs(cfg, "cpu")
    return space.plan(cfg, runs, dropped, predicted or {})


# --------------------------------------------------------------------------------------------
# synthetic records: AR(1) step times at the default noise of tests/test_interval.py


def record(spec, speed: float, rng: np.random.Generator, status: str = "ok") -> dict:
    """A valid record of `spec` whose steady steps take 10 ms / `speed`, times a run effect
    N(0, SIGMA_A²) and per-step noise of CV in STEP_CV, lag-1 correlation PHI (the warm-up
    epoch three times slower); 3 s of set-up. A `status` other than ok: a failed run's record.
    """
    if status != "ok":
        launch = {"command": None, "mode": "local", "exit_code": 1}
        return metrics.failure_record(spec.to_dict(), status, "injected", "", 4.0, launch)
    a, cv = rng.standard_normal() * SIGMA_A, rng.uniform(*STEP_CV)
    steps, epochs = spec.steps_per_epoch, []
    for e in range(spec.epochs):
        z = np.empty(steps)
        z[0] = rng.standard_normal()
        for i in range(1, steps):
            z[i] = PHI * z[i - 1] + rng.standard_normal() * math.sqrt(1 - PHI**2)
        t = 0.01 / speed * np.exp(-a + cv * z - cv * cv / 2) * (3 if e == 0 else 1)
        seconds, samples = float(t.sum()), steps * spec.global_batch_size
        epochs.append({"epoch": e + 1, "seconds": seconds, "samples": samples, "steps": steps,
                       "samples_per_second": samples / seconds, "train_loss": 1.0,
                       "step_seconds_p50": float(np.median(t)),
                       "step_seconds_p95": float(np.percentile(t, 95)),
                       "step_batch_means": steptimes.batch_means(list(t)),
                       "test_accuracy": None, "test_loss": None})  # fmt: skip
    rec = metrics.ok_record(spec.to_dict(), epochs, None)
    rec["wall_seconds"] = sum(e["seconds"] for e in epochs) + 3.0
    rec["device"] = {"kind": "cpu", "name": "cpu", "count": 1, "logical": False,
                     "utilization_mean": None, "energy_joules": None}  # fmt: skip
    rec["data"] = {"train_samples": 1437, "test_samples": 360}
    return rec


def run_round(s: space.Space, round: int, speeds: dict, rng, previous=None, so_far=None,
              failing=()) -> tuple[records.Round, list]:  # fmt: skip
    """Round `round` of the tune `s` on synthetic records (the cells' `speeds` by strategy;
    the runs of `failing` fail): its result and every record so far."""
    made = list(so_far or [])
    asked = previous.next if previous else s.first_runs()
    for cell, repeats in asked.items():
        for path in (f"{cell}/repeat~{r}" for r in repeats):
            spec = s.spec(round, path)
            status = "failed" if path in failing else "ok"
            out = f"results/t/tune/round~{round}/runs/{path}/metrics.json"
            made.append((round, out, record(spec, speeds[spec.strategy], rng, status)))
    return rule.round_result(round_zero(s), round, made, previous), made


def round_zero(s: space.Space) -> records.RoundZero:
    """Round 0 as the rounds read it, through its JSON."""
    return records.RoundZero.from_json(json.loads(json.dumps(s.to_json())))


def by_strategy(result: records.Round) -> dict[str, records.CellDecision]:
    return {c.values["strategy"]: c for c in result.cells}


# --------------------------------------------------------------------------------------------
# round 0 and the runs of each round


def test_round_zero_drops_what_the_memory_model_says_will_not_fit():
    """A cell predicted over limit × headroom is dropped with its reason even where
    memory.check: warn keeps it in the study; the others are tried and say what was
    predicted; the matrix's own drops are listed beside it."""
    cfg = study("torch-ddp", "torch-fsdp", matrix={"workers": [1, 2]},
                memory={"check": "warn", "limit_gib": 1})  # fmt: skip
    runs, dropped = build_runs(cfg, "cpu")
    limit = {"limit_bytes": 2**30, "headroom": 0.9, "method": "traced", "error": None}
    predicted = {r.path: {**limit, "total_bytes": 2**31 if r.strategy == "torch-fsdp" and
                          r.workers == 1 else 2**28} for r in runs}  # fmt: skip
    s = space.plan(cfg, runs, dropped, predicted)
    assert sorted(c.split("/")[0] for c in s.cells) == ["strategy~torch-ddp"] * 2 + [
        "strategy~torch-fsdp"]  # fmt: skip
    (over,) = [d for d in s.dropped if "memory" in d.reason]
    assert over.values["strategy"] == "torch-fsdp" and over.values["workers"] == 1
    assert "predicted 2 GiB per rank, allowed 0.9 GiB" in over.reason
    assert all("predicted 0.25 GiB" in why for why in s.kept.values())
    rows = results.table(round_zero(s), [])
    assert set(rows["decision"]) == {"go on", "stopped"} and (rows["round"] == 0).all()


def test_round_one_runs_every_cell_twice_with_more_where_cells_are_few():
    """Two runs a cell in round 1; three where a panel has fewer than 4 cells (its pooled
    run-to-run variance then has at least 4 degrees of freedom); every run of every round
    the same length (one warm-up epoch, tune.epochs steady ones), without evaluation."""
    four = plan(study("torch", "torch-ddp", "torch-fsdp", "lightning-ddp"))
    two = plan(study("torch", "torch-ddp"))
    assert {len(r) for r in four.first_runs().values()} == {2}
    cell = next(iter(two.cells))
    assert two.first_runs()[cell] == [0, 1, 2]
    r5 = two.spec(3, f"{cell}/repeat~5")
    assert (r5.epochs, r5.steps_per_epoch, r5.evaluate, r5.seed) == (2, 40, False, 5)
    assert r5.path == f"{cell}/repeat~5" and two.spec(1, f"{cell}/repeat~0").epochs == 2
    with pytest.raises(ValueError, match="not a run of round 1"):
        two.spec(1, f"{cell}/repeat~{two.max_repeats}")
    assert not evaluates(r5, synthetic=False, epoch=r5.epochs)
    assert evaluates(two.cells[cell], synthetic=False, epoch=two.cells[cell].epochs)


def test_a_budget_below_round_one_stops_before_any_job():
    cfg = study("torch", "torch-ddp", tune={"max_runs": 5})
    with pytest.raises(ConfigError, match=r"tune.max_runs 5: round 1 runs the 2 cells 6 times"):
        plan(cfg)


def test_worker_hours_below_round_ones_prediction_stop_before_any_job():
    """Round 0 predicts round 1's worker-seconds (budget.FirstRound): a budget under it stops
    the tune before any job, naming the key, the prediction and the fix; one above it plans."""
    first = plan(study("torch", "torch-ddp")).first_round()
    assert first.runs == 6 and first.worker_seconds >= 6 * budget.SETUP_SECONDS
    too_small = first.worker_hours * 0.9
    with pytest.raises(ConfigError, match=r"tune.max_worker_hours .* cannot pay for round 1, "
                       r"predicted before any job at 6 runs, .* worker-hours .*Raise tune.max_"
                       r"worker_hours above .*fewer cells.*tune.steps_per_epoch"):  # fmt: skip
        plan(study("torch", "torch-ddp", tune={"max_worker_hours": too_small}))
    assert plan(study("torch", "torch-ddp", tune={"max_worker_hours": first.worker_hours * 1.1}))


def test_round_ones_prediction_counts_each_runs_steps_at_its_flops():
    """A step's floor is 6 × parameters × samples over a rate no device reaches: more steps
    and a larger batch cost more, a CPU worker with more threads less."""
    torch = plan(study("torch"))
    spec = torch.spec(1, f"{next(iter(torch.cells))}/repeat~0")
    base = budget.step_floor_seconds(spec)
    assert base > 0
    wider = dataclasses.replace(spec, global_batch_size=2 * spec.global_batch_size)
    assert budget.step_floor_seconds(wider) == pytest.approx(2 * base)
    threads = dataclasses.replace(spec, threads_per_worker=2 * spec.threads_per_worker)
    assert budget.step_floor_seconds(threads) == pytest.approx(base / 2)
    assert budget.steps(dataclasses.replace(spec, steps_per_epoch=8)) == spec.epochs * 8
    digits = data.info("digits").train_samples // spec.global_batch_size  # caps a longer epoch
    assert budget.steps(dataclasses.replace(spec, steps_per_epoch=10**9)) == spec.epochs * digits


# --------------------------------------------------------------------------------------------
# rounds on synthetic records (the race itself: tests/test_race.py)


def race_to_the_end(s: space.Space, speeds: dict, rng, failing=()) -> list[records.Round]:
    """Every round of the tune `s` on synthetic records, to the one that ends it."""
    rounds, made = [], []
    while not rounds or not rounds[-1].done:
        result, made = run_round(s, len(rounds) + 1, speeds, rng, rounds[-1] if rounds else
                                 None, made, failing)  # fmt: skip
        rounds.append(result)
    return rounds


def test_rounds_on_synthetic_records_stop_the_slower_and_end_with_a_winning_set(tmp_path):
    """Three cells' synthetic records through the round's code (records -> evidence -> the
    race): torch-fsdp, 20 % slower, is stopped in round 1; torch-ddp and lightning-ddp,
    equally fast, go on, though one of lightning-ddp's runs failed (spent, no evidence); the
    race ends with winners among them, whose estimates come from their confirmation runs.
    tune.csv has every cell of every round, and the costs count every run."""
    s = plan(study("torch-ddp", "torch-fsdp", "lightning-ddp"))
    speeds = {"torch-ddp": 1.0, "lightning-ddp": 1.0, "torch-fsdp": 0.8}
    failing = [f"{c}/repeat~0" for c in s.cells if "lightning" in c]
    rounds = race_to_the_end(s, speeds, np.random.default_rng(3), failing)
    one = rounds[0]
    cells = by_strategy(one)
    assert cells["torch-fsdp"].decision == "stopped"
    assert cells["torch-fsdp"].reason.startswith("slower than the panel's best")
    assert {cells[k].decision for k in ("torch-ddp", "lightning-ddp")} == {"go on"}
    assert cells["lightning-ddp"].ok == 2 and cells["lightning-ddp"].runs == 3
    assert one.failed == [records.FailedRun(failing[0].rsplit("/repeat~")[0], 0, "failed",
                                            "injected")]  # fmt: skip
    assert one.runs == 9 and one.done is None and len(one.next) == 2
    last = rounds[-1]
    assert last.done and not last.next
    assert {c.decision for c in last.cells} <= {"best", "stopped"}
    winners = results.winners(rounds)
    assert winners and {c.values["strategy"] for c in winners} <= {"torch-ddp", "lightning-ddp"}
    assert all("confirmation runs" in c.reason for c in winners)
    assert records.Round.from_json(json.loads(json.dumps(last.to_json()))) == last
    older = [{k: v for k, v in c.items() if k != "ran"} for c in last.to_json()["cells"]]
    assert {c.ran for c in records.Round.from_json({**last.to_json(), "cells": older}).cells} == {1}
    csv = results.table(round_zero(s), rounds)
    assert list(csv.columns[:17]) == ["round", *MATRIX_KEYS]
    assert {"estimate", "ci_low", "ci_high", "decision", "reason"} <= set(csv.columns)
    assert csv.groupby("round").size().to_dict() == {0: 3, **{r + 1: 3 for r in range(len(rounds))}}
    assert set(csv["decision"]) <= {"go on", "stopped", "best"}
    ok = csv[csv["round"] > 0]
    assert (ok["ci_low"] < ok["estimate"]).all() and (ok["estimate"] < ok["ci_high"]).all()
    cost = results.costs(round_zero(s), rounds)
    assert cost.runs == last.spent_runs and cost.grid_runs == 6
    assert cost.grid_worker_hours > 0


def test_the_cost_objective_compares_every_n_of_a_model_in_one_panel():
    """objective cost: one panel over N = 1 and 2. The same global batch at the same step time
    on 2 workers costs twice the device-time per sample: stopped as costlier, N = 1 wins.
    With prices the estimate is money per million samples, without them device-hours."""
    for cost, unit in (({"device_hour": {"cpu-core": 0.04}}, "cost per million samples"),
                       ({}, "device-hours per million samples")):  # fmt: skip
        cfg = study("torch-ddp", matrix={"workers": [1, 2]}, tune={"objective": "cost"},
                    cost=cost)  # fmt: skip
        s = plan(cfg)
        assert len({tuple(c.panel) for c in s.round_zero().cells}) == 1
        one, _ = run_round(s, 1, {"torch-ddp": 1.0}, np.random.default_rng(1))
        by_n = {c.world_size: c for c in one.cells}
        assert by_n[1].unit == by_n[2].unit == unit
        assert by_n[2].estimate == pytest.approx(2 * by_n[1].estimate, rel=0.15)
        assert by_n[2].decision == "stopped" and by_n[1].decision == "best"


def test_an_unpriced_device_stops_its_cost_panel_with_a_reason():
    """objective cost with a price for CPU cores only: a cell whose runs ran on a device
    without a price stops the whole panel, never compared with the priced ones."""
    cfg = study("torch-ddp", matrix={"workers": [1, 2]}, tune={"objective": "cost"},
                cost={"device_hour": {"cpu-core": 0.04}})  # fmt: skip
    s = plan(cfg)
    rng, made = np.random.default_rng(4), []
    for cell, repeats in s.first_runs().items():
        for r in repeats:
            spec = s.spec(1, f"{cell}/repeat~{r}")
            rec = record(spec, 1.0, rng)
            if spec.world_size == 2:
                rec["device"] = {**rec["device"], "kind": "cuda", "name": "Unpriced GPU"}
            made.append((1, f"results/t/tune/round~1/runs/{spec.path}/metrics.json", rec))
    one = rule.round_result(round_zero(s), 1, made, None)
    assert {c.decision for c in one.cells} == {"stopped"} and not one.next
    assert all("mixes priced and unpriced devices" in c.reason for c in one.cells)


def test_repeats_takes_an_integer_or_min_and_max():
    """{min: n, max: n} plans n repeats as the integer n does; max > min plans every repeat
    a cell may run (the racing step asks for those past min), and max < min stops with a
    message naming the fix."""
    assert len(build_runs(study("torch", repeats={"min": 3, "max": 3}), "cpu")[0]) == 3
    raced = build_runs(study("torch", repeats={"min": 2, "max": 4}), "cpu")[0]
    assert [r.repeat for r in raced] == [0, 1, 2, 3]
    assert [r.seed - raced[0].seed for r in raced] == [0, 1, 2, 3]
    assert repeat_range({"min": 2, "max": 4}) == (2, 4) and repeat_count({"min": 2, "max": 4}) == 2
    with pytest.raises(ConfigError, match="max 1 is below min 2"):
        build_runs(study("torch", repeats={"min": 2, "max": 1}), "cpu")


# --------------------------------------------------------------------------------------------
# the budget


@pytest.mark.parametrize("budget", ["max_runs", "max_worker_hours"])
def test_the_budget_ends_the_tune_before_a_round_it_cannot_pay_for(budget):
    """Six equal cells: round 1 leaves some going on; a budget that round 1 fits but round
    2 would pass ends the tune after round 1, the cells going on then are the winning set,
    their estimates labelled biased (no room for confirmation runs), and what was spent stays
    within the budget."""
    strategies = ("torch", "torch-ddp", "torch-fsdp", "lightning-ddp", "deepspeed-zero0",
                  "horovod-torch")  # fmt: skip
    first, _ = run_round(plan(study(*strategies)), 1, dict.fromkeys(strategies, 1.0),
                         np.random.default_rng(6))  # fmt: skip
    assert first.next and first.runs == 12
    spent = first.spent_worker_seconds / 3600
    limit = {"max_runs": 13, "max_worker_hours": spent * 1.01}[budget]
    s = plan(study(*strategies, tune={budget: limit}))
    capped, _ = run_round(s, 1, dict.fromkeys(strategies, 1.0), np.random.default_rng(6))
    assert not capped.next and capped.done.startswith("budget: the next")
    assert f"tune.{budget}" in capped.done
    assert {c.decision for c in capped.cells} <= {"best", "stopped"}
    won = [c for c in capped.cells if c.decision == "best"]
    assert [c.cell for c in won] == list(first.next)
    assert all(c.reason.endswith("selected: biased up") for c in won)
    assert capped.spent_runs <= s.settings.max_runs if budget == "max_runs" else (
        capped.spent_worker_seconds / 3600 <= limit)  # fmt: skip


# --------------------------------------------------------------------------------------------
# best.yaml


def test_best_yaml_is_a_study_of_exactly_the_winning_set(tmp_path):
    """Winners that are not a product of values (2 strategies × 2 batch sizes × 2 worker
    counts, 3 of the 8 cells): best.yaml, laid over config.yaml as --configfile lays it,
    plans exactly those cells, under study <study>-best."""
    cfg = study("torch-ddp", "torch-fsdp", matrix={"batch_size": [64, 128], "workers": [1, 2]})
    runs, _ = build_runs(cfg, "cpu")
    cells = {space.cell_of(r.path): r for r in runs}
    chosen = [c for c in cells if ("ddp" in c and "64" in c and "workers~1" in c)
              or ("fsdp" in c and "128" in c)]  # fmt: skip
    winners = [{k: getattr(cells[c], k) for k in MATRIX_KEYS} for c in chosen]
    best = results.best_config(copy.deepcopy(cfg), winners)
    assert best["study"] == "t-best" and "faults" not in best
    base = yaml.safe_load(overlay.BASE_CONFIG.read_text())
    planned, _ = build_runs(validated(overlay.overlay(base, best)), "cpu")
    assert sorted({space.cell_of(r.path) for r in planned}) == sorted(chosen)
    nobody = tmp_path / "best.yaml"
    results.write_best(nobody, cfg, [], "tune.csv")
    assert "found no winner" in nobody.read_text() and yaml.safe_load(nobody.read_text()) is None


def test_trainscale_tune_runs_snakemake_tune_with_the_study():
    cmd = cli.command("s.yaml", ["--cores", "2"], here=ROOT)
    assert cmd[1:] == ["-m", "snakemake", "tune", "--configfile", "s.yaml", "--cores", "2"]
    away = cli.command("s.yaml", ["-n"], here=ROOT / "docs")
    assert away[4:6] == ["--snakefile", str(ROOT / "Snakefile")]


# --------------------------------------------------------------------------------------------
# a real tune through the workflow


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict:
    """`trainscale tune .test/tune.yaml --cores 2` in a fresh directory: two cells of one
    panel, torch-ddp's repeat 1 made to fail, and a budget of 10 runs: round 1's 6 and the
    winners' confirmation runs (more rounds run in tests/test_slurm.py's tune)."""
    work = tmp_path_factory.mktemp("tune")
    cfg = load_yaml(ROOT / ".test" / "tune.yaml")
    cfg["tune"]["max_runs"] = 10
    (work / "study.yaml").write_text(yaml.safe_dump(cfg))
    p = subprocess.run([PYTHON, "-m", "trainscale", "tune", "study.yaml", "--cores", "2"],
                       cwd=work, env=run_env(), capture_output=True, text=True,
                       timeout=900)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {"work": work, "out": work / "results" / cfg["study"] / "tune"}


@pytest.mark.slow
def test_a_real_tune_writes_its_rounds_table_winners_and_report(tuned):
    out = tuned["out"]
    files = sorted(out.glob("round~*/runs/**/metrics.json"))
    rounds = sorted(json.loads(p.read_text())["round"] for p in out.glob("round~*/round.json"))
    assert files and rounds == list(range(1, len(rounds) + 1))
    recs = [metrics.read(f) for f in files]  # valid against the metrics schema
    assert all(r["spec"]["evaluate"] is False and r["test"]["accuracy"] is None for r in recs)
    ok = [r for r in recs if r["status"] == "ok"]  # each with its cell's memory prediction
    assert all(r["memory"]["predicted"]["total_bytes"] > 0 for r in ok)
    assert all(e["test_accuracy"] is None for r in recs for e in r["epochs"])
    (failed,) = [r for r in recs if r["status"] != "ok"]
    assert failed["spec"]["strategy"] == "torch-ddp" and failed["spec"]["repeat"] == 1
    csv = pd.read_csv(out / "tune.csv")
    assert list(csv.columns[:17]) == ["round", *MATRIX_KEYS]
    assert set(csv["decision"]) <= {"go on", "stopped", "best"}
    assert (csv["decision"] == "best").any()
    assert csv["round"].max() == rounds[-1] and (csv["round"] == 0).sum() == 2
    last = json.loads((out / f"round~{rounds[-1]}" / "round.json").read_text())
    assert last["done"] and not last["next"] and last["spent_runs"] == len(recs) <= 10
    won = [c for c in last["cells"] if c["decision"] == "best"]
    assert won and all("confirmation runs" in c["reason"] for c in won)
    assert "from its confirmation runs" in (out / "best.yaml").read_text()
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "torch-ddp" in page and 'src="http' not in page
    assert "Failed runs" in page and "repeat~1" in page


@pytest.mark.slow
def test_best_yaml_of_a_real_tune_plans_as_a_study(tuned):
    best = load_yaml(tuned["out"] / "best.yaml")
    assert best["study"] == "ci-tune-best"
    p = snakemake(
        tuned["work"], "-n", "--quiet", "host", "--configfile", str(tuned["out"] / "best.yaml")
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    planned = {line.split("strategy~")[1].split("/")[0] for line in p.stdout.splitlines()
               if "results/ci-tune-best/runs/strategy~" in line}  # fmt: skip
    assert planned == set(best["matrix"]["strategy"])

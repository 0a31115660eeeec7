"""A run whose loss diverged ends `diverged`, keeps its finished epochs, and is never ranked.

Unit tests of the check (trainscale.measure.divergence), of the record and of what the tables,
summary, report and compare make of a diverged run; then one small real study (marked slow) in
which a planted learning rate of 1e6 (config `faults`, kind `diverge`) makes a torch, a
DeepSpeed, a Horovod, a Lightning and a Keras run diverge beside a healthy torch-ddp run.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from test_aggregate import ok_record, spec_for, write

from trainscale.analysis import aggregate
from trainscale.analysis.aggregate import CELL
from trainscale.analysis.study import Study
from trainscale.compare.sides import Side
from trainscale.compare.verdicts import compare_cell
from trainscale.measure import divergence, metrics
from trainscale.plan.matrix import build_runs
from trainscale.plan.runspec import DIVERGE_LR
from trainscale.report import rows
from trainscale.runners.torch.torch_parts import SkippedSteps

from conftest import reuse_deepspeed_ops, snakemake, study_records, validated


def test_the_first_unsound_loss_is_named_with_the_last_finite_one():
    watch = divergence.LossWatch()
    assert watch.epoch(1, [2.3, 2.2, 2.1]) is None
    d = watch.epoch(2, [2.0, 2.31, math.nan, 5.0])
    assert (d.epoch, d.step, d.last_sound) == (2, 3, 2.31)
    assert d.message().startswith("loss became nan at epoch 2 step 3; last finite 2.31.")
    exploded = divergence.LossWatch()
    assert exploded.epoch(1, [2.3, 2e4]) is None  # below 1e4 × its first (2.3)
    d = exploded.epoch(2, [1.8e22])
    assert (d.epoch, d.step, d.last_sound) == (2, 1, 2e4) and "1.8e+22" in d.message()
    first = divergence.LossWatch().epoch(1, [math.inf])
    assert (first.step, first.last_sound) == (1, None) and "last finite none" in first.message()
    elsewhere = divergence.LossWatch().epoch(3, [1.0, 1.0], elsewhere=True)
    assert (elsewhere.epoch, elsewhere.step) == (3, 2)  # another worker's; here at its end


def test_keras_running_means_give_each_steps_loss():
    assert divergence.step_losses([2.0, 1.5, 2.0]) == [2.0, 1.0, 3.0]
    assert math.isnan(divergence.step_losses([2.0, math.nan, 3.0])[2])


def test_a_planted_divergence_is_the_runs_learning_rate():
    m = {"strategy": ["torch", "torch-ddp"], "model": ["seed-small"], "dataset": ["digits"]}
    faults = [{"match": {"strategy": "torch"}, "kind": "diverge"}]
    runs, _ = build_runs(validated({"study": "d", "matrix": m, "faults": faults}))
    lrs = {r.strategy: (r.lr, r.fault and r.fault.kind) for r in runs}
    assert lrs == {"torch": (DIVERGE_LR, "diverge"), "torch-ddp": (0.001, None)}


def diverged_record(spec) -> dict:
    """What a runner writes after the loss went nan in epoch 2: epoch 1 kept."""
    rec = ok_record(spec, [])
    watch = divergence.LossWatch()
    watch.epoch(1, [2.3, 2.31])
    return divergence.mark(rec, watch.epoch(2, [2.2, math.nan]))


def test_a_diverged_run_is_counted_never_ranked_and_listed_with_its_reason(tmp_path):
    runs = tmp_path / "runs"
    healthy, bad = spec_for("torch", 1), spec_for("torch-ddp", 1)
    paths = [write(runs, healthy, ok_record(healthy, [0.5, 0.5]))]
    paths.append(write(runs, bad, ok_record(bad, [0.1, 0.1])))  # the fastest repeat, if ok
    diverged = spec_for("torch-ddp", 1, repeat=1)
    rec = diverged_record(diverged)
    paths.append(write(runs, diverged, rec))
    back = metrics.read(paths[-1])
    assert back["status"] == "diverged" and back["diverged_at"] == {"epoch": 2, "step": 2}
    assert back["last_finite_loss"] == 2.2 and len(back["epochs"]) == 1
    for rec in (back, {**back, "epochs": [], "throughput": None}):
        metrics.validate(rec)
    study = Study.build(paths)
    ddp = study.scaling.set_index("strategy").loc["torch-ddp"]
    assert (ddp["ok"], ddp["runs"], ddp["statuses"]) == (1, 2, "1 diverged, 1 ok")
    assert ddp["throughput_mean"] == pytest.approx(10000)  # the ok repeat's alone
    text = aggregate.summary_text(study.runs, [], "t", study.scaling)
    assert "1/2" in text and "[diverged]" in text and "loss became nan at epoch 2 step 2" in text
    (failed,) = rows.failed_rows(study)
    assert failed["status"] == "diverged" and failed["first"].startswith("loss became nan")
    # every run of the cell diverged: the summary ranks the healthy strategy alone
    only = Study.build([paths[0], paths[2]])
    assert list(only.fastest["strategy"]) == ["torch"]


def test_compare_says_a_diverged_cell_is_not_comparable():
    side = {"ok": 2, "runs": 2, "statuses": {"ok": 2}, "test_accuracy": None,
            "peak_device_bytes": None, "peak_host_rss_bytes": 1,
            "throughput": {"n": 2, "mean": 1.0, "ci95": 0.1, "values": [1.0, 1.0]}}  # fmt: skip
    new = {**side, "ok": 0, "statuses": {"diverged": 2}}
    key = dict.fromkeys(CELL, 0) | {"strategy": "torch", "tp": 1}
    row = compare_cell(tuple(key.values()), Side.of(side), Side.of(new), 0.05, "bootstrap")
    assert (row.verdict, row.reason) == ("not comparable", "diverged in NEW (2 diverged)")


def test_steps_the_grad_scaler_skipped_are_counted_without_a_sync_per_step():
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    skips = SkippedSteps()
    for scale in (1.0, math.inf, 1.0, math.inf):  # an overflowing gradient every other step
        opt.zero_grad()
        scaler.scale((w * scale).sum()).backward()
        with skips.counting(scaler):
            scaler.step(opt)
            scaler.update()
    assert skips.total() == 2 and torch.isfinite(w).all()


# --- a real study --------------------------------------------------------------------------------

#: one run per framework family, 1 worker each (a minute on 2 cores: start-up, mostly)
STUDY = {
    "study": "diverge",
    "epochs": 2,
    "steps_per_epoch": 3,
    "timeout_minutes": 5,
    "target_accuracy": None,
    "matrix": {
        "strategy": ["torch-ddp", "deepspeed-zero0", "horovod-torch", "lightning-ddp", "tf"],
        "model": ["seed-small"],
        "dataset": ["digits"],
        "batch_size": [64],
        "workers": [1],
    },
    "faults": [
        {"match": {"strategy": s}, "kind": "diverge"}
        for s in ("deepspeed-zero0", "horovod-torch", "lightning-ddp", "tf")
    ],
}


@pytest.mark.slow
def test_planted_divergence_in_every_framework_beside_a_healthy_run(tmp_path):
    cfg = tmp_path / "study.yaml"
    cfg.write_text(yaml.safe_dump(STUDY))
    reuse_deepspeed_ops(tmp_path)
    target, card = "results/diverge/summary.txt", "results/diverge/scaling-card.json"
    p = snakemake(tmp_path, target, card, "--cores", "2", "--configfile", str(cfg))
    assert p.returncode == 0, p.stderr[-4000:]  # a diverged run's job succeeds
    recs = {r["spec"]["strategy"]: r for r, _ in study_records(tmp_path / "results" / "diverge")}
    assert recs["torch-ddp"]["status"] == "ok", recs["torch-ddp"]["error"]
    for name in STUDY["faults"]:
        rec = recs[name["match"]["strategy"]]
        assert rec["status"] == "diverged", (rec["spec"]["strategy"], rec["error"])
        assert rec["diverged_at"] == {"epoch": 1, "step": 2}, rec["spec"]["strategy"]
        assert rec["last_finite_loss"] == pytest.approx(2.3, abs=0.1) and rec["epochs"] == []
        assert rec["error"].startswith("loss became ")
    summary = (tmp_path / target).read_text()
    assert "[diverged]" in summary and "N=1: torch-ddp" in summary, summary
    # the scaling card (its schema's failure statuses) lists them as failures
    failures = json.loads((tmp_path / card).read_text())["failures"]["runs"]
    assert sorted(f["status"] for f in failures) == ["diverged"] * len(STUDY["faults"])

"""The GPT CI study (.test/gpt.yaml) through Snakemake: gpt-nano on the shipped byte corpus
under every strategy family that trains a GPT, at 2 workers (torch and torch-tp at 1 too), up
to the report; and one
run of the issue's bar on synthetic tokens (GPT-2's padded vocabulary)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from trainscale.analysis import comm_model
from trainscale.models import gpt
from trainscale.plan.matrix import build_runs

from conftest import base_config, launch, run_test_study, study_records

#: strategies that train the same global batches as one process, with the same update: their
#: validation loss after the same steps matches torch's (TensorFlow initialises its own weights)
SAME_AS_ONE_PROCESS = ("torch-ddp", "torch-fsdp", "torch-pipeline", "torch-tp")


@pytest.fixture(scope="module")
def gpt_study(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("gpt-study")
    results, p = run_test_study(work, "gpt", "report.html", "summary.txt")
    return {"results": results, "recs": [r for r, _ in study_records(results)]}


def test_every_strategy_trains_gpt_nano_on_tokens(gpt_study):
    recs = gpt_study["recs"]
    assert len(recs) == 7
    failed = [(r["spec"]["strategy"], r["error"]) for r in recs if r["status"] != "ok"]
    assert not failed
    params = {r["model"]["params"] for r in recs}
    # vocabulary 256 (bytes), context 64: V·C + T·C + L·(12·C² + 2·C) + C
    assert params == {256 * 128 + 64 * 128 + 4 * (12 * 128**2 + 2 * 128) + 128}
    for r in recs:
        assert r["data"]["seq_len"] == 64 and r["data"]["vocab_size"] == 256
        assert r["tokens_per_second"] == pytest.approx(r["throughput"] * 64)
        assert r["flops"]["per_sample"] > 0
        assert 0 < r["flops"]["mfu"] <= 1
        assert r["test"]["perplexity"] == pytest.approx(math.exp(r["test"]["loss"]))
        assert 0 < r["test"]["accuracy"] < 1 and r["test"]["confusion"] is None
        keras = r["spec"]["strategy"].startswith("tf")  # no such choice in Keras
        assert r.get("optimizer") == (None if keras else {"implementation": "fused"})


def test_data_parallel_and_pipeline_match_one_process(gpt_study):
    by = {(r["spec"]["strategy"], r["spec"]["workers"]): r for r in gpt_study["recs"]}
    one = by[("torch", 1)]["test"]["loss"]
    for strategy in SAME_AS_ONE_PROCESS:
        assert by[(strategy, 2)]["test"]["loss"] == pytest.approx(one, rel=2e-3), strategy


def test_report_gives_token_cells_in_tokens_per_second(gpt_study):
    results = gpt_study["results"]
    scaling = pd.read_csv(results / "scaling.csv")
    assert (scaling["seq_len"] == 64).all()
    assert scaling["tokens_per_second_mean"].gt(0).all() and scaling["mfu_mean"].gt(0).all()
    assert "tokens/s" in (results / "summary.txt").read_text()
    assert "tokens/s" in (results / "report.html").read_text()


def test_tensor_parallel_cells_are_recorded_scaled_and_modelled(gpt_study):
    """torch-tp at 2 ranks (tp 2) against its one-rank run (tp 1): its mesh and split in the
    record, a speedup in scaling.csv, and its activation traffic in communication.csv."""
    results = gpt_study["results"]
    tp = [r for r in gpt_study["recs"] if r["spec"]["strategy"] == "torch-tp"]
    assert sorted((r["spec"]["workers"], r["spec"]["tp"]) for r in tp) == [(1, 1), (2, 2)]
    two = next(r for r in tp if r["spec"]["tp"] == 2)
    assert two["env"]["mesh"] == {"dp": 1, "tp": 2} and two["tp"]["sequence_parallel"]
    scaling = pd.read_csv(results / "scaling.csv")
    row = scaling[(scaling["strategy"] == "torch-tp") & (scaling["workers"] == 2)].iloc[0]
    assert row["tp"] == 2 and row["speedup"] > 0
    # the communication model over the study's tables and a gloo benchmark of 2 ranks at a
    # flat 1 GB/s (this study runs none: collectives.enabled false)
    coll = pd.DataFrame(
        {"status": "ok", "backend": "gloo", "workers": 2, "nodes": 1, "world_size": 2,
         "bytes": [2.0**10, 2.0**30], "busbw_bytes_per_second": 1e9}
    )  # fmt: skip
    runs = pd.read_csv(results / "runs.csv", low_memory=False)
    comm = comm_model.communication_frame(scaling, runs, coll)
    row = comm[comm["strategy"] == "torch-tp"].iloc[0]
    # 4 layers with sequence parallelism: (4·4 + 2.5) activations of 8·64·128 fp32 values,
    # plus the loss's 3 fp32 values per token (8·64), the logits split by vocabulary
    activation = 8 * 64 * 128 * 4
    assert row["tp_message_bytes"] == activation
    assert row["tp_bytes"] == 18.5 * activation + 3 * 8 * 64 * 4
    # 2(n − 1)/n · V / B, and no FSDP part at dp 1
    assert row["predicted_comm_seconds"] == pytest.approx(row["tp_bytes"] / 1e9)
    assert "tensor parallelism: activations" in row["note"]
    # the report says why the scaling prediction leaves it out
    html = (results / "report.html").read_text()
    assert "Not predicted:" in html and "<code>torch-tp</code>: the model extrapolates" in html


def test_the_bar_on_synthetic_tokens(tmp_path):
    """gpt-nano on synthetic-tokens at seq_len 128 (vocabulary 50,304), one torch run."""
    cfg = base_config(model=["gpt-nano"], dataset=["synthetic-tokens"], seq_len=[128],
                      batch_size=[4])  # fmt: skip
    cfg.update(steps_per_epoch=2, repeats=1)
    (spec,), _ = build_runs(cfg)
    assert "seq_len~128" in spec.path
    out = tmp_path / "metrics.json"
    p = launch(spec, out)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok" and rec["data"]["vocab_size"] == 50_304
    assert rec["tokens_per_second"] == pytest.approx(rec["throughput"] * 128)
    assert 0 < rec["flops"]["mfu"] <= 1
    per_token = rec["flops"]["per_sample"] / 128
    analytic = gpt.analytic_flops_per_token("gpt-nano", 128, 50_304)
    assert per_token == pytest.approx(analytic, rel=0.1)
    assert rec["test"]["accuracy"] is None  # random ids: nothing to score

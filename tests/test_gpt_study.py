"""The GPT CI study (.test/gpt.yaml) through Snakemake: gpt-nano on the shipped byte corpus
under every strategy family that trains a GPT, at 1 and 2 workers, up to the report; and one
run of the issue's bar on synthetic tokens (GPT-2's padded vocabulary)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from trainscale.models import gpt
from trainscale.plan.matrix import build_runs

from conftest import base_config, launch, reuse_deepspeed_ops, run_test_study, study_records

#: strategies that train the same global batches as one process, with the same update: their
#: validation loss after the same steps matches torch's (horovod-torch's Adam starts at step 1
#: by Horovod's own state broadcast; TensorFlow initialises its own weights)
SAME_AS_ONE_PROCESS = ("torch-ddp", "torch-fsdp", "deepspeed-zero2", "deepspeed-zero3",
                       "torch-pipeline", "lightning-ddp")  # fmt: skip


@pytest.fixture(scope="module")
def gpt_study(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("gpt-study")
    reuse_deepspeed_ops(work)
    results, p = run_test_study(work, "gpt", "report.html", "summary.txt")
    return {"results": results, "recs": [r for r, _ in study_records(results)]}


def test_every_strategy_trains_gpt_nano_on_tokens(gpt_study):
    recs = gpt_study["recs"]
    assert len(recs) == 16
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

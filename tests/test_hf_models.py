"""Hugging Face causal LMs by their config (`matrix.model: hf:NAME`,
trainscale.plan.preflight.hf_models, trainscale.models.hf): safe names in paths, the checks before
any job (vocabulary, positions, heads over tp, no Keras twin), and a user's config.json trained
through Snakemake under the PyTorch family, counting transformers' own parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from helpers import report_of_runs

from trainscale.plan.matrix import ConfigError, build_runs
from trainscale.plan.preflight import hf_models

import tap
from conftest import reuse_deepspeed_ops, run_env, snakemake, study_records, validated

#: a Llama-style config that trainscale does not ship: GQA (4 heads over 2), SwiGLU, untied
MINI = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 300,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
}  # fmt: skip


def hf_config(models: list[str], **matrix) -> dict:
    m = {"strategy": ["torch"], "model": models, "dataset": ["shakespeare"], "seq_len": [32],
         "batch_size": [8], **matrix}  # fmt: skip
    return validated({"study": "t", "steps_per_epoch": 2, "matrix": m})


@pytest.fixture
def mini(tmp_path, monkeypatch) -> str:
    """hf:configs/mini.json, relative to the directory the planner runs in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mini.json").write_text(json.dumps(MINI))
    return "hf:configs/mini.json"


def test_names_are_safe_in_paths_distinct_per_config_and_kept_as_written(mini, tmp_path):
    runs, _ = build_runs(hf_config(["hf:tiny-llama", mini]))
    by = {r.own_model.builder_kwargs["name"]: r for r in runs}
    assert by.keys() == {"hf:tiny-llama", mini}
    for run in by.values():
        assert run.model.startswith("hf-") and run.model in run.path
        assert all(c.isalnum() or c in "._-" for c in run.model), run.model
    assert by[mini].model.startswith("hf-mini-")
    other = tmp_path / "configs" / "other" / "mini.json"  # same stem, another config
    other.parent.mkdir()
    other.write_text(json.dumps({**MINI, "num_hidden_layers": 3}))
    (again,), _ = build_runs(hf_config(["hf:configs/other/mini.json"]))
    assert again.model.startswith("hf-mini-") and again.model != by[mini].model


def test_what_cannot_run_is_dropped_with_the_reason(mini):
    cfg = hf_config([mini], strategy=["torch", "tf", "torch-tp", "torch-pipeline"],
                    seq_len=[32, 256], workers=[1, 4], tp=[1, 4])  # fmt: skip
    runs, dropped = build_runs(cfg)
    assert {(r.strategy, r.seq_len, r.workers, r.tp) for r in runs} == {
        ("torch", 32, 1, 1),
        ("torch-tp", 32, 1, 1),  # torch-tp's one-rank baseline
    }
    reasons = {tuple(d.values[k] for k in ("strategy", "seq_len", "workers", "tp")): d.reason
               for d in dropped}  # fmt: skip
    assert reasons["torch", 256, 1, 1] == (
        f"{mini}: seq_len 256 is above the config's max_position_embeddings 128"
    )
    assert "is a Hugging Face PyTorch model, which has no Keras twin" in reasons["tf", 32, 1, 1]
    assert reasons["torch-tp", 32, 4, 4] == (
        f"{mini}: tp 4 must divide its 4 attention heads and 2 key-value heads"
    )
    assert "decoder layers take the position embeddings" in reasons["torch-pipeline", 32, 1, 1]


def test_a_vocabulary_below_the_datas_ids_stops_before_any_job(tmp_path):
    with pytest.raises(ConfigError, match="hf:tiny-llama has vocab_size 256, below the 50,304 "
                                          "ids of data set 'synthetic-tokens'"):  # fmt: skip
        build_runs(hf_config(["hf:tiny-llama"], dataset=["synthetic-tokens"]))
    matrix = {"strategy": ["torch"], "model": ["hf:tiny-llama"], "dataset": ["synthetic-tokens"],
              "seq_len": [32]}  # fmt: skip
    study = {"study": "v", "matrix": matrix}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    p = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "study.yaml"))
    assert p.returncode != 0
    assert "vocab_size 256, below the 50,304 ids" in p.stdout + p.stderr


def test_a_config_in_bfloat16_builds_fp32_masters(tmp_path, monkeypatch):
    """Most Hub configs say "torch_dtype": "bfloat16", which transformers builds as it says:
    the run's fp32 cell gets fp32 parameters from the builder (what every runner and the
    memory trace build), 4 bytes each in the trace."""
    from trainscale.models import torch_models as models
    from trainscale.runners.torch.memory import trace as memory_trace

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bf16.json").write_text(json.dumps({**MINI, "torch_dtype": "bfloat16"}))
    (run,), _ = build_runs(hf_config(["hf:bf16.json"]))
    assert run.precision == "fp32"
    net = models.build(run.model, (32,), 256, run.own_model, seed=0)
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    traced = memory_trace.predict(run, "cpu")["parts"]["parameters"]
    assert traced >= 4 * models.param_count(net)


BYTES_ONLY = """
from torch import nn


def build(*, vocab_size, seq_len):
    if vocab_size > 256:
        raise ValueError(f"a byte model: vocab_size {vocab_size} is above 256")
    return nn.Sequential(nn.Embedding(vocab_size, 8), nn.Linear(8, vocab_size))
"""


def test_model_and_data_checks_look_at_the_cells_exclude_leaves(tmp_path, monkeypatch):
    """Two vocabularies (an hf: config of 256 ids and one of 50,304, an own byte model) and
    two token sets, each pair that does not fit excluded: the study plans the pairs that run;
    without the exclusions it stops on the first that does not fit."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.json").write_text(json.dumps({**MINI, "vocab_size": 50304}))
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "bytesonly.py").write_text(BYTES_ONLY)
    small = [{"model": m, "dataset": "synthetic-tokens"} for m in ("hf:tiny-llama", "bytes")]
    study = {"study": "t", "steps_per_epoch": 2, "code": ["code"],
             "models": {"bytes": {"torch": "bytesonly:build", "input": "tokens"}},
             "matrix": {"strategy": ["torch"], "model": ["hf:tiny-llama", "hf:big.json", "bytes"],
                        "dataset": ["shakespeare", "synthetic-tokens"], "seq_len": [32],
                        "batch_size": [8], "exclude": small}}  # fmt: skip
    runs, dropped = build_runs(validated(study))
    ran = {(r.own_model.builder_kwargs.get("name", r.model), r.dataset) for r in runs}
    assert ran == {("hf:tiny-llama", "shakespeare"), ("hf:big.json", "shakespeare"),
                   ("hf:big.json", "synthetic-tokens"), ("bytes", "shakespeare")}  # fmt: skip
    assert len(dropped) == 2
    study["matrix"]["exclude"] = small[1:]
    with pytest.raises(ConfigError, match="hf:tiny-llama has vocab_size 256, below the 50,304"):
        build_runs(validated(study))
    study["matrix"]["exclude"] = small[:1]
    with pytest.raises(ConfigError, match="vocab_size 50304 is above 256"):
        build_runs(validated(study))


def test_an_unknown_config_is_named_with_the_shipped_ones():
    with pytest.raises(ConfigError, match=r"matrix.model\[0\]: 'hf:llama9' is neither a config "
                                          r"shipped with trainscale \(hf:llama3.1-8b"):  # fmt: skip
        build_runs(hf_config(["hf:llama9"]))
    assert {"llama3.2-1b", "llama3.1-8b", "qwen2.5-0.5b", "mistral-7b"} <= set(hf_models.shipped())


@pytest.fixture(scope="module")
def hf_study(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("hf-study")
    reuse_deepspeed_ops(work)
    (work / "configs").mkdir()
    (work / "configs" / "mini.json").write_text(json.dumps(MINI))
    # no torch-ddp or lightning-ddp: they build the model whole, as torch does here, and match
    # one process on a transformer in the GPT and third-party studies and in
    # tests/test_lightning_tokens.py (a Lightning process imports for ~15 CPU-s)
    strategies = ["torch", "torch-fsdp", "torch-tp", "deepspeed-zero3", "tf-mirrored"]
    study = {
        "study": "ci-hf", "epochs": 2, "repeats": 1, "steps_per_epoch": 2, "eval_tokens": 4096,
        "collectives": {"enabled": False},
        # eps 1e-6: AdamW's default 1e-8 amplifies a sum's last bits (test_tensor_parallel)
        "optimizer": {"name": "adamw", "lr": 0.001, "weight_decay": 0.1, "eps": 1e-6},
        "matrix": {
            "strategy": strategies, "model": ["hf:configs/mini.json"],
            "dataset": ["shakespeare"], "seq_len": [32], "batch_size": [8],
            "workers": [1, 2], "tp": [1, 2],
            # torch alone at 1 worker, the rest at 2 (torch-tp at tp 2)
            "exclude": [*({"workers": 1, "strategy": s} for s in strategies[1:]),
                        {"workers": 2, "strategy": "torch-tp", "tp": 1}],
        },
    }  # fmt: skip
    (work / "study.yaml").write_text(yaml.safe_dump(study))
    # up to runs.csv: the one fact of the report read here is rendered from these runs
    # (helpers.report_of_runs), not through the figure and report rules
    p = snakemake(work, "results/ci-hf/runs.csv", "--cores", "2",
                  "--configfile", str(work / "study.yaml"),
                  env=run_env(**tap.env(work / "tap")))  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = work / "results" / "ci-hf"
    recs = [r for r, _ in study_records(results)]
    return {"results": results, "recs": recs, "out": p.stderr, "tap": work / "tap"}


@pytest.mark.slow
def test_a_users_config_trains_under_the_pytorch_family(hf_study, tmp_path):
    from transformers import AutoModelForCausalLM

    from trainscale.models.hf import load_config

    recs = {r["spec"]["strategy"]: r for r in hf_study["recs"]}
    assert recs.keys() == {"torch", "torch-fsdp", "torch-tp", "deepspeed-zero3"}
    assert {s: r["error"] for s, r in recs.items() if r["status"] != "ok"} == {}
    own = AutoModelForCausalLM.from_config(load_config_json(MINI, load_config)).num_parameters()
    assert {r["model"]["params"] for r in recs.values()} == {own}
    assert all(0 < r["flops"]["mfu"] <= 1 for r in recs.values())
    # the config's plan, without sequence parallelism
    assert recs["torch-tp"]["tp"] == {"degree": 2, "data_parallel": 1, "sequence_parallel": False,
                                      "plan": "trainscale.models.hf:tp_plan"}  # fmt: skip
    builds = {s: r["model"]["build"] for s, r in recs.items()}
    assert builds == {"torch": "whole", "torch-fsdp": "meta", "torch-tp": "meta",
                      "deepspeed-zero3": "zero.Init"}  # fmt: skip
    # every run, built whole, on meta or inside zero.Init, started from the same weights (the
    # gathered full state dict of each: tests/tap_plugin); 4 runs, 7 processes
    assert len(list(hf_study["tap"].glob("init-*.pt"))) >= 4
    tap.initial_weights(hf_study["tap"])
    assert "tf-mirrored: hf:configs/mini.json is a Hugging Face PyTorch model" in hf_study["out"]
    html = report_of_runs(hf_study["results"], tmp_path / "report.html")
    assert "Hugging Face LlamaForCausalLM (config configs/mini.json)" in html


@pytest.mark.slow
def test_each_strategy_takes_one_process_steps(hf_study):
    """From the same weights and the same global batches, each data-parallel, sharded or split
    run's validation loss is one process's (2e-3, as the GPT study's)."""
    by = {r["spec"]["strategy"]: r for r in hf_study["recs"]}
    one = by["torch"]["test"]["loss"]
    for s in ("torch-fsdp", "torch-tp", "deepspeed-zero3"):
        assert by[s]["test"]["loss"] == pytest.approx(one, rel=2e-3), s


@pytest.mark.slow
def test_tensor_parallel_ends_with_one_process_weights(hf_study):
    """torch-tp at tp 2 splits the decoder layers by the config's plan and the embedding and
    the untied head by vocabulary (the loss on each rank's share of the logits): its final
    weights are one process's (test_tensor_parallel's tolerance; torch-fsdp-tp's are there)."""
    from test_tensor_parallel import ATOL, RTOL

    ref, final = (tap.final_weights(hf_study["tap"], s) for s in ("torch", "torch-tp"))
    tap.assert_moved(tap.initial_weights(hf_study["tap"]), ref, "torch")
    assert final.keys() == ref.keys()
    for k in ref:
        np.testing.assert_allclose(final[k], ref[k], rtol=RTOL, atol=ATOL, err_msg=k)


def load_config_json(facts: dict, load_config):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(facts, f)
        f.flush()
        return load_config(f.name)

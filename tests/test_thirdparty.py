"""A model written by others: .test/models/othergpt, a small GPT in another project's style,
behind the adapter a user writes (othergpt_adapter). Its constructor prints and logs, its
forward warns, its head shares the token embedding's Parameter, every layer has a bias, its
attention keeps a mask buffer, and its blocks are reachable twice (gpt.transformer.h and the
adapter's `blocks`). The study .test/thirdparty.yaml trains it under each PyTorch-family way
of sharding, splitting or restoring weights that 2 cores can run, through Snakemake, with the
tap plug-in; torch-fsdp-tp (4 ranks) is launched alone. Each run must end ok, count the GPT's
own parameters and FLOPs, and end with the weights its epochs trained, the extra no-sync steps
of exposed communication undone.
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest
import yaml

from trainscale.runners.guarded import Parts

import tap
from conftest import (
    ROOT,
    link_test_models,
    load_yaml,
    preflight_check,
    reuse_deepspeed_ops,
    run_env,
    run_test_study,
    study_records,
)

MODELS = ROOT / ".test" / "models"
SEQ_LEN, VOCAB = 32, 256  # the study's seq_len; shakespeare's byte vocabulary
#: the strategies whose runs time extra no-sync steps, then restore what they trained (ZeRO 0
#: and 1 and horovod-torch-elastic take the same local-replica path as ZeRO 2 and horovod-torch)
EXPOSED = ("torch-ddp", "torch-fsdp", "deepspeed-zero2", "deepspeed-zero3", "horovod-torch")


def gpt_facts() -> tuple[int, int, int]:
    """(the GPT's own parameter count, layers, width) at the study's sizes, built by its code."""
    sys.path.insert(0, str(MODELS))
    try:
        from othergpt import GPT, GPTConfig

        cfg = GPTConfig(block_size=SEQ_LEN, vocab_size=VOCAB)
        return GPT(cfg).num_params(), cfg.n_layer, cfg.n_embd
    finally:
        sys.path.remove(str(MODELS))


@pytest.fixture(scope="module")
def thirdparty(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("thirdparty")
    reuse_deepspeed_ops(work)
    link_test_models(work)
    env = run_env(**tap.env(work / "tap"))
    results, _ = run_test_study(work, "thirdparty", "runs.csv", env=env)  # what is read here
    recs = {r["spec"]["strategy"]: r for r, _ in study_records(results)}
    return {"recs": recs, "tap": work / "tap", "results": results}


@pytest.mark.slow
def test_every_pytorch_strategy_trains_the_model_with_its_own_counts(thirdparty, capsys):
    recs = thirdparty["recs"]
    assert set(recs) == {"torch", "torch-tp", "torch-pipeline", *EXPOSED}
    assert {s: r["error"] for s, r in recs.items() if r["status"] != "ok"} == {}
    assert {s: r["warnings"] for s, r in recs.items() if r["warnings"]} == {}
    params, layers, width = gpt_facts()
    assert "othergpt: number of parameters" in capsys.readouterr().out  # it does print
    assert {r["model"]["params"] for r in recs.values()} == {params}
    # with its adapter's `init`: built on meta where sharded or split, inside zero.Init for
    # ZeRO-3; every run starts from the same weights (test_the_exposed_steps_...: tap)
    meta = {"torch-fsdp": "meta", "torch-tp": "meta", "deepspeed-zero3": "zero.Init"}
    assert {s: r["model"]["build"] for s, r in recs.items()} == {s: meta.get(s, "whole")
                                                                 for s in recs}  # fmt: skip
    # PaLM's count per token: 6N + 12·L·H·Q·T, with H·Q the width
    analytic = 6 * params + 12 * layers * width * SEQ_LEN
    for s, r in recs.items():
        per_token = r["flops"]["per_sample"] / SEQ_LEN
        assert abs(per_token / analytic - 1) <= 0.15, (s, per_token, analytic)
    methods = {s: recs[s]["communication"]["method"] for s in EXPOSED}
    assert methods["torch-fsdp"] == "fsdp-no-gradient-sync"
    assert all(m is not None for m in methods.values()), methods


@pytest.mark.slow
def test_the_exposed_steps_leave_the_trained_weights(thirdparty):
    """The no-sync steps train on after the epochs (FSDP2 leaves the tied embedding on the
    root gathered after each evaluation forward); what the run ends with is what it trained."""
    taps = thirdparty["tap"]
    init = tap.initial_weights(taps)
    for strategy in EXPOSED:
        final, ended = tap.final_weights(taps, strategy), tap.ended_weights(taps, strategy)
        tap.assert_moved(init, final, strategy)
        assert final.keys() == ended.keys()
        for k in final:
            np.testing.assert_array_equal(ended[k], final[k], err_msg=f"{strategy}: {k}")


@pytest.mark.slow
def test_fsdp_tp_trains_it_and_keeps_its_weights(tmp_path):
    """torch-fsdp-tp at dp 2 × tp 2 (4 ranks), its MLP split by the adapter's tp_plan."""
    from test_tensor_parallel import OPTIMIZERS, train

    study = load_yaml(ROOT / ".test" / "thirdparty.yaml")
    own = {"code": [str(MODELS)], "models": {"othergpt": study["models"]["othergpt"]}}
    adamw = {**OPTIMIZERS["adamw"], "lr": 0.005}  # as the study: 0.001 hardly moves it
    rec, init, final = train(tmp_path, "torch-fsdp-tp", 4, 2, adamw, model="othergpt", **own)
    assert rec["warnings"] == [] and rec["model"]["params"] == gpt_facts()[0]
    assert rec["tp"]["plan"] == "othergpt_adapter:tp_plan"
    tap.assert_moved(init, final, "torch-fsdp-tp")
    ended = tap.ended_weights(tmp_path / "torch-fsdp-tp-tap", "torch-fsdp-tp")
    for k in final:
        np.testing.assert_array_equal(ended[k], final[k], err_msg=k)


def test_what_it_prints_never_reaches_the_preflight_answer(tmp_path):
    """`trainscale check` builds it in the pre-flight child: its print, log line and warning go
    to the child's log beside the cache, and the answer arrives whole."""
    link_test_models(tmp_path)
    shutil.copy(ROOT / ".test" / "thirdparty.yaml", tmp_path / "study.yaml")
    p, said = preflight_check(tmp_path)
    assert "models.othergpt: 34,688 parameters at seq_len 32" in p.stderr
    assert "number of parameters" not in p.stdout + p.stderr
    assert "othergpt: number of parameters: 0.0347M" in said
    assert "othergpt: built 2 layers of width 32" in said  # logging.warning
    assert "UserWarning: othergpt: no targets" in said


def test_a_part_that_fails_on_one_rank_fails_on_all_and_is_named_once():
    """runners.guarded.Parts: the ranks' outcomes are agreed, the first error kept, by part."""
    spec = type("Spec", (), {"fault": None})()
    warnings: list[dict] = []
    rank1 = Parts(spec, warnings, agree=lambda error: [error, "ValueError: rank 1's"])
    assert rank1.run("flops", lambda: 3) is None
    assert warnings == [{"part": "flops", "error": "ValueError: rank 1's (on rank 1)"}]
    assert rank1.run("flops", lambda: 1 / 0) is None and len(warnings) == 1  # once per part
    alone = Parts(spec, warnings)
    assert alone.run("memory", lambda: {"peak": 1}) == {"peak": 1}
    assert alone.run("evaluation", lambda: yaml.safe_load("{")) is None
    assert warnings[-1]["part"] == "evaluation"
    assert warnings[-1]["error"].startswith("ParserError: while parsing a flow")
    with pytest.raises(ValueError, match="unknown part 'evaluate'"):
        alone.run("evaluate", lambda: None)

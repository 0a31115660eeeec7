"""Meta-device initialisation (trainscale/models/init.py): the sharding strategies build on the
meta device, or inside deepspeed.zero.Init, and start from the very weights a whole build
gives under the same seed; and a rank's host memory at build is its share, not the model.

The `hf:` model's case is the Hugging Face study's (tests/test_hf_models.py); gpt-nano's under
torch-tp and torch-fsdp-tp is tests/test_tensor_parallel.py's equivalence with one process."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

from trainscale.measure import metrics
from trainscale.models import torch_models as models
from trainscale.models.init import initialise, module_seed, on_meta, to_empty
from trainscale.plan.matrix import build_runs

import tap
from conftest import PYTHON, ROOT, deepspeed_ops_built, launch, run_env, validated


def gpt_runs(strategy: str, workers: int, model: str = "gpt-nano", **kw):
    m = {"strategy": [strategy], "model": [model], "dataset": ["shakespeare"], "seq_len": [32],
         "workers": [workers], "batch_size": [4]}  # fmt: skip
    runs, _ = build_runs(validated({"study": "t", "matrix": m, "epochs": 2, "steps_per_epoch": 1,
                                    "eval_tokens": 4096,
                                    "threads_per_worker": 1, **kw}))  # fmt: skip
    assert len(runs) == 1
    return runs[0]


def test_a_meta_build_initialised_module_wise_is_a_whole_build():
    """One process: built on meta, given storage, initialised; the tied head kept tied."""
    whole = models.build("gpt-nano", (32,), 256, seed=3)
    meta = models.build("gpt-nano", (32,), 256, seed=3, meta=True)
    assert on_meta(meta) and not on_meta(whole)
    to_empty(meta, "cpu")
    models.initialise_module_wise(meta, "gpt-nano", None, 3)
    assert meta[-1].out.weight is meta[0].tokens.weight
    a, b = whole.state_dict(), meta.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = models.build("gpt-nano", (32,), 256, seed=4).state_dict()
    assert not torch.equal(other["1.attn.q.weight"], a["1.attn.q.weight"])
    assert module_seed(3, "1.attn.q") != module_seed(3, "1.attn.k")


def test_a_tensor_the_initialisation_leaves_unset_is_named():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))

    def weight_only(model, module, name):
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.ones_(module.weight)

    with pytest.raises(ValueError, match=r"0\.bias: the model's initialisation .* left it unset"):
        initialise(net, weight_only, 0)


class Masked(torch.nn.Module):
    """A module with an integer buffer (positions) and a bool one (a causal mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(3))
        self.register_buffer("positions", torch.arange(3))
        self.register_buffer("mask", torch.ones(3, 3, dtype=torch.bool).tril())


def test_an_integer_buffer_the_initialisation_leaves_unset_is_named():
    """Integer and bool buffers have no NaN to be caught by: the rule runs on a second copy
    filled otherwise, and an element that differs was not set; set, they are kept."""

    def weight_only(model, module, name):
        torch.nn.init.ones_(module.weight)

    def everything(model, module, name):
        weight_only(model, module, name)
        module.positions.copy_(torch.arange(3))
        module.mask.copy_(torch.ones(3, 3, dtype=torch.bool).tril())

    with pytest.raises(ValueError, match=r"the model\.positions: the model's initialisation"):
        initialise(Masked(), weight_only, 0)
    net = Masked()
    net.positions.zero_()
    net.mask.zero_()
    initialise(net, everything, 0)
    assert net.positions.tolist() == [0, 1, 2] and net.mask.sum() == 6


def test_initialisation_seeds_the_cpu_generator_alone(monkeypatch):
    """torch.manual_seed would seed every CUDA generator too, and fork_rng(devices=[]) puts
    back only the CPU one: a GPU run's dropout stream would depend on when it built its model.
    The CPU generator is put back after each module."""

    def device_seeded(seed):
        raise AssertionError("the initialisation seeded a device generator")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", device_seeded)
    monkeypatch.setattr(torch.cuda, "manual_seed", device_seeded)
    torch.default_generator.manual_seed(11)
    expected = torch.rand(4)
    torch.default_generator.manual_seed(11)
    models.build("gpt-nano", (32,), 256, seed=3)
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.slow
def test_fsdp_and_zero3_start_from_the_whole_builds_weights(tmp_path):
    """gpt-nano's gathered full state dict at the start of training, under torch-fsdp (built on
    meta) and deepspeed-zero3 (built inside zero.Init), both at 2 ranks, equals `torch`'s."""
    deepspeed_ops_built()  # the op the launch loads (this checkout's .cache)
    inits, builds = {}, {}
    for strategy, workers in (("torch", 1), ("torch-fsdp", 2), ("deepspeed-zero3", 2)):
        out, taps = tmp_path / strategy / "metrics.json", tmp_path / f"{strategy}-tap"
        p = launch(gpt_runs(strategy, workers), out, **tap.env(taps))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rec = metrics.read(out)
        assert rec["status"] == "ok", rec["error"]
        builds[strategy] = rec["model"]["build"]
        inits[strategy] = tap.initial_weights(taps)
    assert builds == {"torch": "whole", "torch-fsdp": "meta", "deepspeed-zero3": "zero.Init"}
    for strategy in ("torch-fsdp", "deepspeed-zero3"):
        assert inits[strategy].keys() == inits["torch"].keys(), strategy
        for k, v in inits["torch"].items():
            np.testing.assert_array_equal(inits[strategy][k], v, err_msg=f"{strategy}: {k}")


@pytest.mark.slow
def test_a_ranks_host_memory_at_build_is_its_share(tmp_path):
    """gpt2-774m (3.1 GB of fp32 weights) under torch-fsdp at 2 workers: each rank's peak host
    RSS once built, sharded and initialised stays below the whole model's bytes."""
    vocab = 50304
    spec = gpt_runs("torch-fsdp", 2, model="gpt2-774m", seed=0)
    full = models.param_count(models.build("gpt2-774m", (32,), vocab, seed=0, meta=True)) * 4
    assert full > 3.0e9
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "tests" / "meta_build_rss.py"), json.dumps(spec.to_dict()),
           str(tmp_path / "rss.json"), str(vocab)]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=run_env(OMP_NUM_THREADS="1"), capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rss.{rank}.json").read_text())
        assert got["params"] * 4 == full
        assert abs(got["held"] - full / 2) < 0.01 * full  # its half, no more
        assert got["peak"] < full, (rank, got["peak"] / 1e9, full / 1e9)

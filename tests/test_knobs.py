"""Activation checkpointing and offload (matrix `activation_checkpointing` and `offload`,
trainscale.plan.knobs): the cells that cannot take them dropped with the reason, paths unchanged
without them, and real runs of gpt-nano that train the same weights as one process without
them, as the other equivalence tests check (tests/test_fsdp_pipeline.py, test_deepspeed.py)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from trainscale.measure import metrics
from trainscale.plan.matrix import ConfigError, build_runs

import tap
from conftest import PYTHON, ROOT, deepspeed_ops_built, launch, run_env, validated

#: the equivalence tests' tolerance (rtol 1e-4 / atol 1e-5): a recomputed forward runs the same
#: operations on the same values, and DeepSpeed's CPU Adam is AdamW in another loop order
RTOL, ATOL = 1e-4, 1e-5
ADAMW = {"name": "adamw", "lr": 0.005, "weight_decay": 0.1, "eps": 1e-6}


def plan(strategies, ckpt=("none",), offload=("none",), model="gpt-nano", **kw):
    m = {"strategy": list(strategies), "model": [model], "dataset": ["shakespeare"],
         "seq_len": [32], "batch_size": [8], "workers": [kw.pop("workers", 2)],
         "activation_checkpointing": list(ckpt), "offload": list(offload)}  # fmt: skip
    cfg = {"study": "t", "epochs": 2, "steps_per_epoch": 2, "eval_tokens": 4096,
           "threads_per_worker": 1, "optimizer": kw.pop("optimizer", ADAMW), "matrix": m,
           **kw}  # fmt: skip
    return build_runs(validated(cfg))


def reasons(dropped) -> dict[tuple, str]:
    return {(d.values["strategy"], d.values["activation_checkpointing"], d.values["offload"]):
            d.reason for d in dropped}  # fmt: skip


def test_a_run_without_either_keeps_its_path_and_a_run_with_one_names_it():
    (plain,), _ = plan(["torch"], workers=1)
    assert "activation_checkpointing" not in plain.path and "offload" not in plain.path
    assert plain.activation_checkpointing == "none" and plain.offload == "none"
    runs, _ = plan(["deepspeed-zero3"], ckpt=("full",), offload=("params",))
    assert runs[0].path.endswith("/activation_checkpointing~full/offload~params/repeat~0")


def test_what_cannot_take_a_knob_is_dropped_with_the_reason():
    _, dropped = plan(["tf-mirrored", "torch-fsdp", "deepspeed-zero0", "deepspeed-zero2",
                       "deepspeed-zero3", "torch-ddp"], ckpt=("none", "full", "selective"),
                      offload=("none", "optimizer", "params"))  # fmt: skip
    why = reasons(dropped)
    assert "Keras strategies keep every activation" in why[("tf-mirrored", "full", "none")]
    assert "no FSDP2 equivalent" in why[("torch-fsdp", "none", "optimizer")]
    assert "stage 0 partitions nothing" in why[("deepspeed-zero0", "none", "optimizer")]
    assert "stages 1 and 2 keep whole" in why[("deepspeed-zero2", "none", "params")]
    assert "torch-ddp: no offload" in why[("torch-ddp", "none", "optimizer")]
    assert "ZeRO-3 gathers a block's parameters" in why[("deepspeed-zero3", "selective", "none")]
    assert ("deepspeed-zero2", "selective", "optimizer") not in why
    with pytest.raises(ConfigError, match="CPU Adam; optimizer sgd has none"):
        plan(["deepspeed-zero2"], offload=("optimizer",), optimizer={"name": "sgd", "lr": 0.1})
    cnn = build_runs(validated({"study": "t", "matrix": {
        "strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"],
        "activation_checkpointing": ["full", "selective"]}}))  # fmt: skip
    assert [r.activation_checkpointing for r in cnn[0]] == ["full"]
    assert "seed-small's stages are convolutions" in cnn[1][0].reason


def test_the_memory_preflight_traces_checkpointing_as_the_runner_applies_it():
    """gpt-nano under torch, one step traced on fake tensors (trainscale.runners.torch.
    memory_trace): full checkpointing keeps the blocks' inputs only, selective keeps their
    matrix multiplies' outputs too, so full < selective < none in activations."""
    from trainscale.runners.torch.memory import trace as memory_trace

    runs, _ = plan(["torch"], ckpt=("none", "full", "selective"), workers=1)
    act = {r.activation_checkpointing: memory_trace.predict(r, "cpu")["parts"]["activations"]
           for r in runs}  # fmt: skip
    assert act["full"] < act["selective"] < act["none"], act
    assert act["full"] < 0.5 * act["none"], act


def test_selective_checkpointing_keeps_sequence_parallelisms_reduce_scatters():
    """One training step of gpt-nano under torch-tp's plan with sequence parallelism (tp 2):
    selective checkpointing runs as many reduce-scatters as no checkpointing (their outputs
    are kept, as torchtitan's policy keeps them); full checkpointing recomputes some in the
    backward pass."""
    from test_tensor_parallel import step_collectives

    scatters = {mode: step_collectives(True, mode)["reduce_scatter_tensor"]
                for mode in ("none", "selective", "full")}  # fmt: skip
    assert scatters["selective"] == scatters["none"] < scatters["full"], scatters


def test_full_checkpointing_moves_batchnorm_statistics_once_per_step():
    """A CNN of BatchNorm stages (as resnet50's), 3 SGD steps from the same weights on the
    same batches: with full checkpointing each stage runs twice per step, and its running
    statistics and batch counts end where they end without checkpointing, to the bit."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from trainscale.runners.torch import checkpointing

    def stage(c_in: int, c_out: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out),
                             nn.ReLU(), nn.MaxPool2d(2))  # fmt: skip

    ended = {}
    for mode in ("none", "full"):
        torch.manual_seed(0)
        net = nn.Sequential(stage(3, 8), stage(8, 16), nn.Sequential(nn.Flatten(),
                            nn.Linear(16 * 4 * 4, 10)))  # fmt: skip
        checkpointing.apply(net, None, mode)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        draw = torch.Generator().manual_seed(1)
        for _ in range(3):
            x = torch.randn(4, 3, 16, 16, generator=draw)
            F.cross_entropy(net(x), torch.randint(10, (4,), generator=draw)).backward()
            opt.step()
            opt.zero_grad()
        ended[mode] = {k: v.clone() for k, v in net.state_dict().items()}
    none, full = ended["none"], ended["full"]
    assert none["0.1.num_batches_tracked"] == 3 and none.keys() == full.keys()
    assert not torch.equal(none["1.1.running_var"], torch.ones(16))  # they moved
    for k in none:
        assert torch.equal(full[k], none[k]) if "running" in k or "batches" in k else \
            torch.allclose(full[k], none[k], rtol=RTOL, atol=ATOL), k  # fmt: skip


def tapped(tmp_path, spec) -> tuple[dict, dict]:
    """One real run with the test plug-in: its record and final weights."""
    name = f"{spec.strategy}-{spec.activation_checkpointing}-{spec.offload}"
    out, taps = tmp_path / name / "metrics.json", tmp_path / f"{name}-tap"
    p = launch(spec, out, **tap.env(taps))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    return rec, tap.final_weights(taps, spec.strategy)


@pytest.mark.slow
def test_checkpointing_and_offload_train_one_process_weights(tmp_path):
    """gpt-nano, 4 AdamW steps at a global batch of 8: under torch with selective
    checkpointing, torch-fsdp with full checkpointing and its parameters offloaded,
    ZeRO-3 with full checkpointing and ZeRO-2 with full checkpointing and its optimizer
    offloaded (DeepSpeed's CPU Adam), the weights and losses of `torch` without either."""
    deepspeed_ops_built()
    cmd = [PYTHON, "-m", "trainscale.runners.torch.deepspeed_zero", "--build-ops", "cpu-adam"]
    ops = ROOT / ".cache" / "torch_extensions"
    built = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                           env=run_env(TORCH_EXTENSIONS_DIR=str(ops)))  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # built without debug info (deepspeed_zero.cpu_adam_builder), and loaded as built below
    flags = (ops / "cpu_adam" / "build.ninja").read_text()
    assert " -O3 " in flags and " -g " not in flags, flags
    op = ops / "cpu_adam" / "cpu_adam.so"
    op_built = op.stat().st_mtime_ns
    (ref_spec,), _ = plan(["torch"], workers=1)
    ref_rec, ref = tapped(tmp_path, ref_spec)
    cases = [  # full checkpointing: under FSDP and ZeRO here, and traced (test above)
        *plan(["torch"], ckpt=("selective",), workers=1)[0],
        *plan(["torch-fsdp"], ckpt=("full",), offload=("params",))[0],
        *plan(["deepspeed-zero3"], ckpt=("full",))[0],
        *plan(["deepspeed-zero2"], ckpt=("full",), offload=("optimizer",))[0],
    ]
    assert len(cases) == 4
    for spec in cases:
        rec, final = tapped(tmp_path, spec)
        what = f"{spec.strategy} {spec.activation_checkpointing} {spec.offload}"
        assert rec["spec"]["activation_checkpointing"] == spec.activation_checkpointing
        assert final.keys() == ref.keys(), what
        for k in ref:
            np.testing.assert_allclose(final[k], ref[k], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{what}: {k}")  # fmt: skip
        assert rec["test"]["loss"] == pytest.approx(ref_rec["test"]["loss"], rel=RTOL), what
        flops = rec["flops"]
        if spec.activation_checkpointing == "full":  # a forward more for the blocks
            assert flops["hardware_per_sample"] > 1.2 * flops["per_sample"], what
            assert flops["hfu"] > flops["mfu"], what
        if spec.offload != "none":
            assert rec["offload"] == {"mode": spec.offload, "to": "cpu", "moved": False}, what
        cpu_adam = spec.offload == "optimizer"  # DeepSpeed's; FSDP's host shards: torch's loop
        assert rec["optimizer"]["implementation"] == ("cpu-adam" if cpu_adam else "for-loop")
    tap.assert_moved(tap.initial_weights(tmp_path / f"{ref_spec.strategy}-none-none-tap"), ref,
                     "torch")  # fmt: skip
    # the ZeRO-2 run loaded the op with the flags it was built with: torch's JIT compiles an op
    # again, inside the run, where they differ
    assert op.stat().st_mtime_ns == op_built, "a run built DeepSpeed's CPU Adam op again"

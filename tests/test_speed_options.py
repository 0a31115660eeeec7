"""The speed options `memory_format`, `compile` and `grad_accum` (issue 16 part 4, issue 60):
config checks that name the key, matrix axes whose defaults stay out of a run's path, the
cells dropped with the reason, real runs whose record says, from the tensors and from
TorchDynamo, that the model really was laid out channels_last and compiled, and gradient
accumulation that trains every PyTorch-family strategy as one whole batch would."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml

from trainscale.measure import metrics
from trainscale.plan import catalog, check, matrix, speed_options
from trainscale.plan.matrix import build_runs
from trainscale.plan.runspec import ConfigError, RunSpec
from trainscale.runners.torch import torch_speed

from conftest import launch, snakemake, validated

TORCH = ["torch", "torch-ddp", "lightning-ddp"]


def config(strategies=("torch",), workers=1, **top) -> dict:
    m = {
        "strategy": list(strategies),
        "model": ["seed-small"],
        "dataset": ["synthetic-cifar10"],
        "workers": [workers],
        "batch_size": [32],
    }
    return validated({"study": "t", "matrix": m, "samples": 256, "steps_per_epoch": 4, **top})


# --- the config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "top, needles",
    [
        ({"memory_format": "channel_last"}, ["memory_format: 'channel_last'", "'channels_last'"]),
        ({"memory_format": "nhwc"}, ["memory_format: 'nhwc' is not one of contiguous"]),
        ({"compile": "yes"}, ["compile: 'yes' is not of type 'boolean'"]),
    ],
)
def test_bad_values_are_refused_naming_the_key(tmp_path, capsys, top, needles):
    path = tmp_path / "cfg.yaml"
    m = {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]}
    cfg = {"study": "bad", "matrix": m, **top}
    path.write_text(yaml.safe_dump(cfg))
    problems = check.check_file(path, show_memory=False)
    assert len(problems) == 1, problems
    for needle in needles:
        assert needle in problems[0], problems


def test_a_bad_value_stops_snakemake_before_any_job(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    m = {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]}
    cfg.write_text(yaml.safe_dump({"study": "bad", "matrix": m, "memory_format": "nchw"}))
    p = snakemake(tmp_path, "-n", "--configfile", str(cfg))
    assert p.returncode != 0
    assert "memory_format: 'nchw' is not one of contiguous, channels_last" in p.stdout + p.stderr
    assert not (tmp_path / "results").exists()


def test_defaults_are_contiguous_and_not_compiled():
    (run,), _ = build_runs(config())
    assert (run.memory_format, run.compile) == ("contiguous", False)


def test_the_spec_carries_both_into_the_record():
    (run,), _ = build_runs(config(memory_format="channels_last", compile=True))
    assert (run.memory_format, run.compile) == ("channels_last", True)
    d = run.to_dict()
    assert (d["memory_format"], d["compile"]) == ("channels_last", True)
    assert RunSpec.from_json(run.to_json()) == run
    metrics.validate(metrics.empty_record(d, "failed", "x"))  # the spec's schema takes them
    for bad in ({"memory_format": "nhwc"}, {"compile": "yes"}):
        with pytest.raises(metrics.MetricsError):
            metrics.validate(metrics.empty_record({**d, **bad}, "failed", "x"))
    old = {k: v for k, v in d.items() if k not in ("memory_format", "compile")}
    assert (RunSpec.from_dict(old).memory_format, RunSpec.from_dict(old).compile) == (
        "contiguous",
        False,
    )  # a spec written before the keys existed reads as the defaults


def test_the_options_are_matrix_axes_whose_defaults_stay_out_of_the_path():
    """One study compares DDP with channels_last beside FSDP without: the FSDP cell that
    cannot take it is dropped, the default keeps the path a run had before the axes existed,
    and the top-level key gives the axis its one value where the matrix names none."""
    (plain,), _ = build_runs(config())
    assert "memory_format" not in plain.path and "compile" not in plain.path
    assert "grad_accum" not in plain.path
    for key in ("memory_format", "compile", "grad_accum"):
        assert key in matrix.MATRIX_KEYS
    cfg = config(["torch-ddp", "torch-fsdp"], workers=2)
    cfg["matrix"].update(memory_format=["contiguous", "channels_last"], compile=[False, True])
    cfg["matrix"]["grad_accum"] = [1, 2]
    runs, dropped = build_runs(cfg)
    cells = {(r.strategy, r.memory_format, r.compile, r.grad_accum) for r in runs}
    assert len(runs) == len(cells) == 12  # torch-fsdp: contiguous only
    assert {c for c in cells if c[0] == "torch-fsdp" and c[1] == "channels_last"} == set()
    assert [d.values["strategy"] for d in dropped] == ["torch-fsdp"] * 4
    last = next(r for r in runs if r.memory_format == "channels_last" and r.compile)
    assert "/memory_format~channels_last/compile~True/" in last.path
    assert "grad_accum~2" in next(r for r in runs if r.grad_accum == 2).path
    (top,), _ = build_runs(config(memory_format="channels_last", grad_accum=2))
    assert (top.memory_format, top.grad_accum) == ("channels_last", 2)
    assert top.path.endswith("memory_format~channels_last/grad_accum~2/repeat~0")
    cfg = config(["torch-ddp"], workers=2, memory_format="channels_last")
    cfg["matrix"]["memory_format"] = ["contiguous"]  # the matrix's axis wins
    (axis,), _ = build_runs(cfg)
    assert axis.memory_format == "contiguous" and axis.path == plain.path.replace(
        "strategy~torch/", "strategy~torch-ddp/"
    ).replace("workers~1", "workers~2")
    cfg["matrix"].update(memory_format=["contiguous", "channels_last"])
    cfg["matrix"]["exclude"] = [{"memory_format": "channels_last"}]
    assert len(build_runs(cfg)[0]) == 1


def test_grad_accum_runs_every_pytorch_strategy_and_drops_keras_with_the_reason():
    every = sorted(matrix.IMPLEMENTED)
    cfg = config(every, workers=2, grad_accum=2)
    cfg["matrix"]["model"] = ["seed-small"]
    runs, dropped = build_runs(cfg, "cuda")
    ran = {r.strategy for r in runs}
    reasons = {d.values["strategy"]: d.reason for d in dropped}
    pipe = [r for r in runs if r.strategy == "torch-pipeline"]  # its schedule accumulates
    assert pipe and all(r.microbatches == 8 and r.grad_accum == 2 for r in pipe)
    assert "Keras strategies step the optimizer once per batch" in reasons["tf-multiworker"]
    for s in KERAS:
        why = speed_options.why_not(s, "seed-small", "contiguous", False, grad_accum=2)
        assert s not in ran and "Keras strategies step the optimizer once per batch" in why
    for s in ("torch-ddp", "torch-fsdp", "lightning-ddp", "horovod-torch", "deepspeed-zero1"):
        assert s in ran and all(r.grad_accum == 2 for r in runs if r.strategy == s)


def test_a_step_of_micro_batches_is_the_whole_batch_step():
    """Plugin.step with grad_accum 4 (uneven micro-batches too) leaves the weights and the
    mean loss of one step on the whole batch."""
    from types import SimpleNamespace

    from trainscale.runners.torch.plugin import Plugin

    (run,), _ = build_runs(config())
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    after = {}
    for k in (1, 4):
        spec = dataclasses.replace(run, grad_accum=k)
        loop = SimpleNamespace(spec=spec, device=torch.device("cpu"))
        p = Plugin(loop)
        torch.manual_seed(0)
        p.model = torch.nn.Linear(6, 3)
        p.opt = torch.optim.SGD(p.model.parameters(), lr=0.5)
        p.scaler = torch.amp.GradScaler("cpu", enabled=False)
        loss = p.step(x, y) / k  # the epoch's mean divides by losses_per_step (ranks × k)
        after[k] = (loss.item(), [t.detach().clone() for t in p.model.parameters()])
    assert after[4][0] == pytest.approx(after[1][0], rel=1e-6)
    for a, b in zip(after[1][1], after[4][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


# --- dropped cells ---------------------------------------------------------------------------

KERAS = catalog.names(runtime="tensorflow")


def test_compile_drops_every_keras_strategy_and_data_parallel_with_the_reason():
    cfg = config(["torch", "tf", "tf-mirrored", "torch-dp"], compile=True)
    runs, dropped = build_runs(cfg)
    assert [r.strategy for r in runs] == ["torch"]
    reasons = {d.values["strategy"]: d.reason for d in dropped}
    assert "compile is torch.compile, a PyTorch option" in reasons["tf"]
    assert "compile is torch.compile" in reasons["tf-mirrored"]
    assert "nn.DataParallel" in reasons["torch-dp"] and "use torch-ddp" in reasons["torch-dp"]
    for s in KERAS:
        assert "compile is torch.compile" in speed_options.why_not(
            s, "seed-small", "contiguous", True
        )
    assert all(
        speed_options.why_not(s, "seed-small", "contiguous", True) is None
        for s in catalog.names(runtime="torch")
        if s != "torch-dp"
    )


def test_channels_last_drops_the_strategies_that_cannot_take_it():
    cfg = config(
        ["torch-ddp", "torch-fsdp", "deepspeed-zero1", "horovod-torch", "tf-multiworker"],
        workers=2,
        memory_format="channels_last",
    )
    runs, dropped = build_runs(cfg)
    assert [r.strategy for r in runs] == ["torch-ddp"]
    reasons = {d.values["strategy"]: d.reason for d in dropped}
    assert "FSDP does not support non-contiguous parameters" in reasons["torch-fsdp"]
    assert "byte view" in reasons["deepspeed-zero1"]
    assert "broadcast_parameters" in reasons["horovod-torch"]
    assert "Keras lays image batches out channels-last" in reasons["tf-multiworker"]
    for s in (*KERAS, "torch-pipeline", *catalog.names(framework="deepspeed")):
        assert "channels_last" in speed_options.why_not(s, "seed-small", "channels_last", False)
    for s in ("torch", "torch-dp", *TORCH):
        assert speed_options.why_not(s, "resnet50", "channels_last", False) is None


def test_channels_last_refuses_a_model_without_image_input(monkeypatch):
    flat = dataclasses.replace(catalog.MODELS["seed-small"], name="mlp", published_input=(784,))
    monkeypatch.setitem(catalog.MODELS, "mlp", flat)
    reason = speed_options.why_not("torch", "mlp", "channels_last", False)
    assert reason == "memory_format channels_last: mlp takes no (C, H, W) image input"
    assert speed_options.why_not("torch", "mlp", "contiguous", True) is None


def test_a_matrix_all_dropped_by_an_option_stops_naming_it():
    with pytest.raises(ConfigError, match="matrix is empty.*tf: compile is torch.compile"):
        build_runs(config(["tf"], compile=True))


# --- what the runners record -----------------------------------------------------------------


def test_weight_layout_is_read_from_the_strides():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3))
    assert torch_speed.weight_layout(net) == "contiguous"
    net[1].to(memory_format=torch.channels_last)
    assert torch_speed.weight_layout(net) == "mixed"
    net.to(memory_format=torch.channels_last)
    assert torch_speed.weight_layout(net) == "channels_last"
    one_channel = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.Linear(4, 2))
    assert torch_speed.weight_layout(one_channel.to(memory_format=torch.channels_last)) is None


def test_only_image_batches_are_laid_out():
    (run,), _ = build_runs(config(memory_format="channels_last"))
    x = torch.zeros(4, 3, 5, 5)
    assert torch_speed.laid_out(x, run).is_contiguous(memory_format=torch.channels_last)
    assert not torch_speed.laid_out(x, run).is_contiguous()
    labels = torch.zeros(4)
    assert torch_speed.laid_out(labels, run) is labels
    (plain,), _ = build_runs(config())
    assert torch_speed.laid_out(x, plain) is x


def _record(spec, tmp_path) -> dict:
    out = tmp_path / spec.strategy / "metrics.json"
    p = launch(spec, out, timeout=240)
    record = json.loads(out.read_text())
    assert record["status"] == "ok", (record["error"], p.stdout[-2000:], p.stderr[-2000:])
    return record


@pytest.mark.slow
@pytest.mark.parametrize(
    "options, layout, graphs",
    [
        ({}, "contiguous", 0),
        ({"memory_format": "channels_last"}, "channels_last", 0),
        ({"memory_format": "channels_last", "compile": True}, "channels_last", 1),
    ],
    ids=["plain", "channels_last", "both"],
)
def test_torch_runs_laid_out_and_compiled_as_asked(tmp_path, options, layout, graphs):
    """2 epochs of seed-small (its conv has 3 input channels here, so its weight's layout
    tells) on synthetic CIFAR-10: the record's spec has the options, and the runner reports
    the layout the weights had and the graphs TorchDynamo built (one: the model, no graph
    break), against the plain run's contiguous and 0."""
    (run,), _ = build_runs(config(epochs=2, **options))
    record = _record(run, tmp_path)
    assert record["spec"]["memory_format"] == options.get("memory_format", "contiguous")
    assert record["spec"]["compile"] is options.get("compile", False)
    assert record["model"]["memory_format"] == layout
    assert record["model"]["compiled_graphs"] == graphs
    assert record["throughput"] > 0 and len(record["epochs"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, options, layout",
    [
        ("torch-ddp", {"compile": True, "memory_format": "channels_last"}, "channels_last"),
        ("torch-fsdp", {"compile": True}, "contiguous"),
        ("lightning-ddp", {"compile": True, "memory_format": "channels_last"}, "channels_last"),
        ("deepspeed-zero1", {"compile": True}, "contiguous"),
        ("horovod-torch", {"compile": True}, "contiguous"),
    ],
)
def test_two_workers_compile(tmp_path, strategy, options, layout):
    """Compiled with 2 workers, each as its framework takes it (DDP around the compiled model,
    FSDP2's blocks' forwards, Lightning's compiled LightningModule, DeepSpeed's engine.compile,
    Horovod's hooks on a compiled model): the run is ok and TorchDynamo built graphs (a
    compiled root FSDP2 or DDP module builds none: that would read 0 here)."""
    (run,), _ = build_runs(config([strategy], workers=2, epochs=2, **options))
    record = _record(run, tmp_path)
    assert record["spec"]["compile"] is True
    assert record["model"]["compiled_graphs"] >= 1
    assert record["model"]["memory_format"] == layout
    assert record["device"]["count"] == 2


@pytest.mark.slow
def test_accumulated_steps_train_as_whole_batches_under_every_family(tmp_path):
    """2 workers, 2 micro-batches a step: DDP (no_sync), FSDP2 (gradient sync off) and
    Lightning (accumulate_grad_batches) train seed-small (no BatchNorm) to the epoch losses of
    DDP's whole-batch steps on the same samples, Horovod (backward_passes_per_step) to those
    of its own whole-batch steps."""
    base = {"epochs": 2, "steps_per_epoch": 2}
    want = {}
    for strategy in ("torch-ddp", "horovod-torch"):
        (whole,), _ = build_runs(config([strategy], workers=2, **base))
        rec = _record(whole, tmp_path / "whole")
        want[strategy] = [e["train_loss"] for e in rec["epochs"]]
    for strategy in ("torch-ddp", "torch-fsdp", "lightning-ddp", "horovod-torch"):
        (run,), _ = build_runs(config([strategy], workers=2, grad_accum=2, **base))
        rec = _record(run, tmp_path)
        assert rec["spec"]["grad_accum"] == 2 and "grad_accum~2" in run.path
        got = [e["train_loss"] for e in rec["epochs"]]
        same = want.get(strategy, want["torch-ddp"])
        assert got == pytest.approx(same, rel=1e-5), strategy
        assert [e["steps"] for e in rec["epochs"]] == [2, 2], strategy

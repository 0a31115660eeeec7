"""The speed options `memory_format` and `compile` (issue 16 part 4): config checks that name the
key, the spec that carries them, the cells dropped with the reason, and real runs whose record
says, from the tensors and from TorchDynamo, that the model really was laid out channels_last
and compiled."""

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


def test_the_keys_are_not_matrix_axes():
    """One value per study: the run paths do not change, studies are compared instead."""
    (plain,), _ = build_runs(config())
    (fast,), _ = build_runs(config(memory_format="channels_last", compile=True))
    assert plain.path == fast.path
    assert "memory_format" not in matrix.MATRIX_KEYS and "compile" not in matrix.MATRIX_KEYS


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
        ({"compile": True}, "contiguous", 1),
        ({"memory_format": "channels_last", "compile": True}, "channels_last", 1),
    ],
    ids=["plain", "channels_last", "compile", "both"],
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

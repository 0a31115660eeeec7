"""Will it fit: each cell's memory per rank predicted before any job
(trainscale.plan.preflight.memory, trainscale.runners.torch.memory.trace), its model states exact,
its trace the real step's, the cells over config `memory:`'s limit dropped with the nearest that
fit, and `trainscale fit`."""

from __future__ import annotations

import pytest
import torch
import yaml

from trainscale.models import torch_models as models
from trainscale.plan import check, fit
from trainscale.plan.matrix import build_runs
from trainscale.plan.preflight import memory
from trainscale.plan.studyconfig import Memory, StudyConfig
from trainscale.runners.torch.memory import steps as memory_steps
from trainscale.runners.torch.memory import trace as memory_trace

from conftest import ROOT, base_config, load_yaml

SCHEMA = load_yaml(ROOT / "workflow" / "schemas" / "config.schema.yaml")
#: issue 45's H200 cells: (strategy, model, torch.cuda.max_memory_allocated bytes, the bar)
H200 = [("torch", "gpt2-124m", 17_843_420_672, 0.05),
        ("torch-fsdp", "gpt2-774m", 43_617_351_680, 0.10)]  # fmt: skip
GPT = {"model": ["gpt-nano"], "dataset": ["shakespeare"], "seq_len": [64], "batch_size": [8]}


def gpt_config(**matrix) -> dict:
    cfg = base_config(**{**GPT, **matrix})
    cfg["optimizer"].update(name="adamw", weight_decay=0.1)
    return cfg


def gpt_run(**matrix):
    runs, dropped = build_runs(gpt_config(**matrix))
    assert runs, [d.reason for d in dropped]
    return runs[0]


@pytest.fixture(scope="module")
def nano() -> tuple[int, int]:
    """gpt-nano's (parameters, parameter tensors) at vocabulary 256, context 64."""
    with torch.device("meta"):
        net = models.build("gpt-nano", (64,), 256, None)
    return models.param_count(net), len(list(net.parameters()))


def test_model_states_are_exact_to_the_byte(nano):
    """fp32 parameters, AdamW's two fp32 moments (and a 4-byte step per tensor); FSDP2
    divides the moments by the data-parallel size; Keras counts 16 bytes a parameter."""
    n, tensors = nano
    one = memory_trace.predict(gpt_run(strategy=["torch"]), "cpu")
    assert one["method"] == "traced" and one["traced_on"] == "cpu"
    assert one["parts"]["parameters"] == 4 * n
    assert one["parts"]["optimizer"] == 2 * 4 * n + 4 * tensors
    two = memory_trace.predict(gpt_run(strategy=["torch-fsdp"], workers=[2]), "cpu")
    assert two["parts"]["optimizer"] == 2 * 4 * n // 2 + 4 * tensors
    assert two["parts"]["communication"] > 0  # all-gather and reduce-scatter buffers
    ddp = memory_trace.predict(gpt_run(strategy=["torch-ddp"], workers=[2]), "cpu")
    assert ddp["parts"]["communication"] == 4 * n  # the gradient buckets
    keras = memory_trace.predict(gpt_run(strategy=["tf-mirrored"]), "cpu")
    assert keras["method"] == "model-states" and keras["total_bytes"] == 16 * n


def test_the_fake_trace_is_the_real_step():
    """The same step of gpt-nano under torch, allocated for real: within 1% (the trackers
    see the same storages, so it is exact)."""
    spec = gpt_run(strategy=["torch"])
    fake = memory_trace.predict(spec, "cpu")["total_bytes"]
    with memory_steps.real_tensors():
        real = memory_trace.predict(spec, "cpu")["total_bytes"]
    assert abs(fake / real - 1) < 0.01


def test_cells_over_the_limit_are_dropped_with_the_nearest_that_fit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the cache is relative to where Snakemake runs
    cfg = gpt_config(strategy=["torch", "torch-fsdp"], workers=[1, 2], batch_size=[8, 64])
    runs, dropped = build_runs(cfg)
    need = {(r.strategy, r.world_size, r.batch_size): a["total_bytes"] for r, a in
            zip(runs, memory.predict(runs, "cpu").values(), strict=True)}  # fmt: skip
    assert "predicting the memory of 6 cells" in capsys.readouterr().err
    over = need[("torch", 1, 64)]
    assert need[("torch", 1, 8)] < over and need[("torch-fsdp", 2, 64)] < over
    limit = (over - 1) / 0.9 / 2**30  # torch at batch 64 just over limit × headroom
    check_ = memory.resolve(Memory.of({"limit_gib": limit, "check": "drop"}), "cpu")
    kept, dropped, predicted = fit.within_limits(check_, runs, dropped, "cpu")
    assert "predicting" not in capsys.readouterr().err  # every answer from the cache
    (why,) = [d.reason for d in dropped if d.reason.startswith("torch gpt-nano")]
    assert why.startswith(f"torch gpt-nano batch 64: needs {over / 2**30:.3g} GiB per rank, over")
    assert f"({limit:g} × 0.9); fits at batch 8, or with torch-fsdp at " in why
    assert {(r.strategy, r.batch_size, r.world_size) for r in kept if r.strategy == "torch"} == {
        ("torch", 8, 1)
    }
    assert set(predicted) == {r.path for r in runs}
    assert predicted[kept[0].path]["limit_bytes"] == int(limit * 2**30)
    warn = memory.resolve(Memory.of({"limit_gib": limit, "check": "warn"}), "cpu")
    kept, _, _ = fit.within_limits(warn, runs, [], "cpu")
    assert len(kept) == len(runs) and "(memory.check: warn, kept)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"limit_gib": -1}, "memory.limit_gib: -1 is less than or equal to the minimum of 0"),
        ({"check": "maybe"}, "memory.check: 'maybe' is not one of drop, warn, off"),
        ({"headroom": 1.5}, "memory.headroom: 1.5 is greater than the maximum of 1"),
        ({"limt_gib": 80}, "memory.limt_gib: unknown key; did you mean 'limit_gib'?"),
    ],
)
def test_bad_memory_values_are_refused_naming_the_key(value, needle):
    problems = check.config_problems({**gpt_config(), "memory": value}, SCHEMA)
    assert any(needle in p for p in problems), problems


def test_an_unquoted_off_is_read_as_off(tmp_path):
    """YAML reads `check: off` unquoted as false: the study takes it as the word it wrote."""
    path = tmp_path / "study.yaml"
    study = {"study": "quiet", "matrix": {"strategy": ["torch"], **GPT}}
    path.write_text(yaml.safe_dump(study) + "memory: {check: off}\n")
    config, problems = check.load_config(path)
    assert problems == [] and config["memory"]["check"] == "off"
    assert memory.resolve(StudyConfig.from_filled(config).memory, "cuda").mode == "off"
    problems = check.config_problems({**gpt_config(), "memory": {"check": True}}, SCHEMA)
    assert any("True is not one of drop, warn, off" in p and "quote" in p for p in problems)


def test_a_cpu_study_that_asks_for_a_check_must_give_the_limit():
    with pytest.raises(memory.ConfigError, match="memory.limit_gib: a CPU study has no device"):
        memory.resolve(Memory.of({"check": "drop"}), "cpu")
    assert memory.resolve(Memory.of({}), "cpu").mode == "off"  # the CPU default: nothing predicted


def test_check_prints_each_cell_and_fit_finds_the_largest_batch(tmp_path, monkeypatch, capsys):
    """`trainscale fit` bisects the batch sizes the study could run (here every size is
    predicted once up front, one child, so check and fit read the cache)."""
    monkeypatch.chdir(tmp_path)
    study = {"study": "fits", "matrix": {**GPT, "strategy": ["torch", "torch-fsdp"],
                                         "workers": [2]}}  # fmt: skip
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    config, _ = check.load_config(path)
    config.pop("_inherited")
    (template,) = [r for r in build_runs(config)[0] if r.strategy == "torch-fsdp" and not r.repeat]
    sizes = fit.candidates(StudyConfig.from_filled(config), template, 32, "cpu")
    assert [r.batch_size for r in sizes] == [2, 4, 6, 8, 12, 16, 24, 32]  # splits over 2
    need = {r.batch_size: a["total_bytes"] for r, a in
            zip(sizes, memory.predict(sizes, "cpu").values(), strict=True)}  # fmt: skip
    assert need[16] < need[24]
    assert check.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "predicted memory per rank (limit none" in out
    cell = "torch-fsdp gpt-nano on shakespeare, N=2, batch 8 global, fp32"
    assert f"{cell}: {need[8] / 2**30:.3g} GiB (traced)" in out
    study["memory"] = {"limit_gib": (need[16] + need[24]) / 2 / 0.9 / 2**30}
    path.write_text(yaml.safe_dump(study))
    assert check.fit_main([str(path), "--max-batch", "32"]) == 0
    out = capsys.readouterr()
    assert "torch-fsdp gpt-nano shakespeare at 2 workers: batch 16 (global)" in out.out
    assert "predicting" not in out.err  # the cache answered every probe


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "model", "measured", "bar"), H200,
                         ids=["124m-torch", "774m-fsdp"])  # fmt: skip
def test_the_h200_cells_are_predicted_within_their_bar(strategy, model, measured, bar):
    """Issue 45's cells, measured on an H200 (bf16 autocast, seq_len 1024, batch 16, AdamW,
    torch.cuda.max_memory_allocated) and predicted here for CUDA, traced on CPU: gpt2-124m
    within 5 % (issue 59; +0.5 % since the trace holds no logits through the backward),
    gpt2-774m under torch-fsdp within 10 % (−3.1 %)."""
    spec = gpt_run(strategy=[strategy], model=[model], dataset=["synthetic-tokens"],
                   seq_len=[1024], batch_size=[16], precision=["bf16"])  # fmt: skip
    a = memory_trace.predict(spec, "cuda")
    assert a["traced_on"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert abs(measured / a["total_bytes"] - 1) <= bar, a["total_bytes"]

"""Memory at scale (issue 59): each rank's host memory and the SLURM request that follows it,
the replica the exposed-communication step builds only where it fits, DeepSpeed's states from
its ds_config, FSDP offload's gathered units, a model of many blocks scaled from a few, a cache
key that follows every file the trace imports, and `trainscale fit` naming a failed probe."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap

import pytest
import yaml

from trainscale.plan import fit
from trainscale.plan.check import fit_main
from trainscale.plan.matrix import build_runs
from trainscale.plan.preflight import memory, memory_key, memory_parts
from trainscale.plan.studyconfig import Memory, StudyConfig
from trainscale.runners.torch.memory import trace as memory_trace

from conftest import PYTHON, ROOT, SNAKEMAKE, base_config, run_env

GPT = {"model": ["gpt-nano"], "dataset": ["shakespeare"], "seq_len": [64], "batch_size": [8]}
GIB = 2**30


def gpt_run(**matrix):
    cfg = base_config(**{**GPT, **matrix})
    cfg["optimizer"].update(name="adamw", weight_decay=0.1)
    runs, dropped = build_runs(cfg)
    assert runs, [d.reason for d in dropped]
    return runs[0]


#: a whole build in a fresh process (after a tiny one has run the code it runs): the bytes of
#: its parameters and buffers, and the resident memory it added (VmRSS)
BUILD = """
import gc, json, sys
from pathlib import Path
import torch
from trainscale.models import torch_models as models

def rss():
    line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024

torch.set_num_threads(1)
warm = models.build("gpt-nano", (64,), 65, None, seed=0)
del warm
gc.collect()
before = rss()
net = models.build(sys.argv[1], (int(sys.argv[2]),), int(sys.argv[3]), None, seed=0)
grown = rss() - before
held = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()])
print(json.dumps({"held": held, "grown": grown}))
"""


def test_a_whole_build_holds_its_parameters_on_the_host():
    """The planner's build bytes (fp32 parameters and buffers, counted without torch) against
    the resident memory a whole build adds (measured: +1.3 % for gpt-micro)."""
    spec = gpt_run(model=["gpt-micro"], dataset=["synthetic-tokens"], seq_len=[256])
    assert memory_parts.build_mode(spec) == "whole"
    _, parts = memory_parts.host(spec, "cuda")
    p = subprocess.run(
        [PYTHON, "-c", BUILD, spec.model, str(spec.seq_len), "50304"],
        env=run_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert parts["build"] == got["held"] > 100 * 2**20
    assert abs(parts["build"] / got["grown"] - 1) < 0.05, got


def test_host_bytes_follow_the_build_and_the_offload():
    """Every cell gets host bytes without a trace: a whole build's fp32 model, none for one
    built on meta, FSDP offload's fp32 shards and optimizer state on the host; the SLURM
    request covers the node's ranks."""
    ddp = gpt_run(strategy=["torch-ddp"], workers=[2])
    fsdp = gpt_run(strategy=["torch-fsdp"], workers=[2])
    offload = gpt_run(strategy=["torch-fsdp"], workers=[2], offload=["params"])
    n = memory_parts.param_count(ddp)
    assert (memory_parts.build_mode(ddp), memory_parts.build_mode(fsdp)) == ("whole", "meta")
    whole, parts = memory_parts.host(ddp, "cuda")
    assert parts["build"] == 4 * n and parts["offload"] == 0
    assert memory_parts.host(fsdp, "cuda")[1]["build"] == 0
    assert memory_parts.host(offload, "cuda")[1]["offload"] == (4 + 4 + 8) * n // 2
    mb = memory_parts.slurm_mem_mb(ddp, whole)
    assert mb * 2**20 >= 2 * whole * 1.1


def test_fp32_zero2_counts_four_byte_parameters():
    """DeepSpeed's model states from its ds_config: fp32 parameters replicated (4 bytes each),
    gradients, the fp32 master copy and Adam's state partitioned; bf16 parameters 2 bytes."""
    spec = gpt_run(strategy=["deepspeed-zero2"], workers=[2])
    n = memory_parts.param_count(spec)  # exact for a GPT (its shape's arithmetic)
    fp32 = memory_trace.predict(spec, "cpu")
    assert fp32["parts"]["model_states"] == 4 * n + 4 * n // 2 + 16 * n // 2
    bf16 = gpt_run(strategy=["deepspeed-zero2"], workers=[2], precision=["bf16"])
    low = memory_trace.predict(bf16, "cpu")
    assert low["parts"]["model_states"] == 2 * n + 2 * n // 2 + 16 * n // 2
    assert low["parts"]["communication"] == 2 * 500_000_000  # its reduce bucket, bf16
    # its engine runs the model cast to bf16 without autocast, whose fp32 norms and softmax
    # DDP's step keeps (on an H200 the autocast trace over-counted ZeRO-2 by 16 %)
    ddp = gpt_run(strategy=["torch-ddp"], workers=[2], precision=["bf16"])
    assert low["parts"]["activations"] < memory_trace.predict(ddp, "cpu")["parts"]["activations"]
    # an image model's batches are cast with it, as its runner casts them
    (image,), _ = build_runs(base_config(strategy=["deepspeed-zero2"], precision=["bf16"]))
    assert memory_trace.predict(image, "cpu")["parts"]["activations"] > 0


def test_fsdp_offload_at_one_rank_keeps_the_gathered_parameters():
    """Over one rank no unit reshards: the bf16 parameters each unit runs with stay on the
    device, only the fp32 shards, their gradients and the optimizer state leave it."""
    spec = gpt_run(strategy=["torch-fsdp"], precision=["bf16"], offload=["params"])
    kept = memory_trace.predict(spec, "cuda")
    n = memory_parts.param_count(spec)
    assert 2 * n <= kept["parts"]["parameters"] < 2.1 * n
    assert kept["parts"]["optimizer"] == 0
    assert kept["parts"]["runtime"] == memory_parts.CUDA_RUNTIME_BYTES
    assert kept["reserved_bytes"] == kept["total_bytes"] + memory_parts.CUDA_RUNTIME_BYTES


def test_a_model_of_many_blocks_is_scaled_from_two_and_three_exactly():
    """gpt-micro's 6 blocks traced at 3 and 4 and scaled: the whole trace's bytes."""
    for strategy, workers in (("torch", 1), ("torch-fsdp", 2)):
        spec = gpt_run(model=["gpt-micro"], strategy=[strategy], workers=[workers])
        scaled = memory_trace.predict(spec, "cpu")["total_bytes"]
        assert scaled == memory_trace.predict(spec, "cpu", scale=False)["total_bytes"]


def test_the_replica_is_skipped_over_the_limit_with_the_reason(tmp_path, monkeypatch):
    """A DeepSpeed cell's replica, predicted as the torch cell at its micro-batch, beside the
    run's own states: over a small limit it is skipped, with a reason; under a large one it
    is built. The launcher's index carries it (what the runner reads)."""
    monkeypatch.chdir(tmp_path)
    spec = gpt_run(strategy=["deepspeed-zero2"], workers=[2])
    assert memory.replica_spec(spec).strategy == "torch"
    small = memory.resolve(Memory.of({"limit_gib": 0.01, "check": "warn"}), "cpu")
    _, _, predicted = fit.within_limits(small, [spec], [], "cpu")
    p = predicted[spec.path]
    assert p["replica_bytes"] > 0 and p["host_bytes"] > 0
    why = memory.replica_skipped(p)
    assert why.startswith("not measured: its whole-model replica") and "no allocation" in why
    large = memory.resolve(Memory.of({"limit_gib": 1000, "check": "warn"}), "cpu")
    assert memory.replica_skipped(fit.within_limits(large, [spec], [], "cpu")[2][spec.path]) is None
    index = memory.write_index("t", predicted, [spec])
    monkeypatch.setenv(memory.INDEX_ENV, str(index))
    assert memory.recorded(spec)["replica_bytes"] == p["replica_bytes"]


def test_a_node_over_the_host_limit_is_dropped_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs, dropped = build_runs(base_config(**{**GPT, "strategy": ["torch-ddp"], "workers": [1, 2]}))
    check = memory.resolve(Memory.of({"host_limit_gib": 1.2}), "cpu")  # check off: no trace
    kept, dropped, predicted = fit.within_limits(check, runs, dropped, "cpu")
    assert {r.workers for r in kept} == {1}
    (why,) = [d.reason for d in dropped if "host memory" in d.reason]
    assert re.match(r"torch-ddp gpt-nano batch 8: its 2 ranks on a node need [\d.]+ GiB of host "
                    r"memory \([\d.]+ GiB each", why), why  # fmt: skip
    assert all(p["total_bytes"] is None and p["host_bytes"] > 0 for p in predicted.values())


def test_a_dropped_cell_is_told_which_knob_fits_from_predictions(tmp_path, monkeypatch):
    """Just over the limit, the reason names what its own predictions bring under it (a
    halved batch at least), each with its GiB, and what they do not."""
    monkeypatch.chdir(tmp_path)
    cfg = base_config(**{**GPT, "strategy": ["torch-fsdp"], "workers": [2], "batch_size": [64]})
    runs, dropped = build_runs(cfg)
    need = memory.need(memory.predict(runs, "cpu")[runs[0].path])
    limit = need / 0.9 / GIB * 0.999
    check = memory.resolve(Memory.of({"limit_gib": limit, "check": "drop"}), "cpu")
    with pytest.raises(memory.ConfigError) as e:  # its one cell dropped
        fit.within_limits(check, runs, dropped, "cpu", StudyConfig.from_filled(cfg))
    why = str(e.value)
    assert "no cell of this model in the matrix fits; predicted under the limit: " in why, why
    assert re.search(r"batch 32 \([\d.]+ GiB\)", why), why
    assert re.search(r"over it: .*offload params \([\d.]+ GiB\)", why), why


def test_editing_any_module_the_trace_imports_predicts_again(monkeypatch):
    """The key's sources are the trace's imports read by grimp (checkpointing, torch_speed
    and imagesets among them); a new modification time, a library version or where the
    trace runs makes a new key."""
    spec = gpt_run()
    files = {str(f.relative_to(ROOT / "workflow")) for f in memory_key._sources(spec)}
    for name in ("runners/torch/checkpointing.py", "runners/torch/torch_speed.py",
                 "data/imagesets.py", "runners/torch/memory/steps.py"):  # fmt: skip
        assert f"trainscale/{name}" in files
    before = memory_key.key(spec, "cuda", memory.VERSION)
    edited = ROOT / "workflow" / "trainscale" / "runners" / "torch" / "checkpointing.py"
    st = edited.stat()
    try:
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert memory_key.key(spec, "cuda", memory.VERSION) != before
    finally:
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert memory_key.key(spec, "cuda", memory.VERSION) == before
    monkeypatch.setattr(memory_key, "versions", lambda: {"torch": "0.0"})
    assert memory_key.key(spec, "cuda", memory.VERSION) != before


def test_the_flop_counter_kept_count_is_keyed_by_its_sources(monkeypatch):
    """The Keras runs keep their torch twin's FLOP count beside the study (keras_flops), keyed
    by the counter's sources: an edit to it or to a module it imports counts again."""
    counter = "trainscale.runners.torch.flop_count"
    before = memory_key.sources_version(counter)
    edited = ROOT / "workflow" / "trainscale" / "runners" / "torch" / "flop_count.py"
    st = edited.stat()
    try:
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert memory_key.sources_version(counter) != before
    finally:
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert memory_key.sources_version(counter) == before
    assert "trainscale.models.torch_models" in memory_key.trace_modules(counter)
    monkeypatch.setattr(memory_key, "versions", lambda: {"torch": "0.0"})
    assert memory_key.sources_version(counter) != before


PLANTED = """
    import torch
    from torch import nn

    class Wide(nn.Module):
        def __init__(self, input_shape, classes):
            super().__init__()
            c, h, w = input_shape
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, classes))

        def forward(self, x):
            if x.shape[0] > 2:
                raise RuntimeError("planted: no trace past 2 samples")
            return self.net(x)

    def build(*, input_shape, classes):
        return Wide(input_shape, classes)
"""


def test_fit_reports_a_probe_whose_trace_fails_with_its_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "__init__.py").write_text(textwrap.dedent(PLANTED))
    study = {"study": "planted", "code": [str(tmp_path)],
             "models": {"wide": {"torch": "planted:build"}},
             "matrix": {"strategy": ["torch"], "model": ["wide"], "dataset": ["digits"],
                        "batch_size": [2]}, "memory": {"limit_gib": 1}}  # fmt: skip
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert fit_main([str(path), "--max-batch", "4"]) == 1
    out = capsys.readouterr().out
    assert "torch wide digits at 1 workers: batch 2 (global)" in out
    assert "larger not predicted: batch 3: RuntimeError: planted: no trace past 2" in out
    assert "none of the batch sizes" not in out


def test_the_slurm_request_covers_the_ranks_host_prediction(tmp_path):
    """`snakemake -n --profile profiles/slurm` of a study with a whole-build cell: its train
    job asks for mem_mb at least its ranks × their predicted host bytes."""
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"study": "hostmem", "matrix": {
        **GPT, "strategy": ["torch-ddp"], "workers": [2]}}))  # fmt: skip
    p = subprocess.run(
        [SNAKEMAKE, "results/hostmem/scaling.csv", "-n", "--quiet", "host", "--profile",
         "profiles/slurm", "--directory", str(tmp_path), "--configfile", str(study)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    index = json.loads((tmp_path / ".cache" / "trainscale" / "memory" / "study-hostmem.json")
                       .read_text())  # fmt: skip
    (entry,) = index.values()
    host = entry["predicted"]["host_bytes"]
    assert entry["predicted"]["host_parts"]["build"] > 0  # torch-ddp builds whole
    asked = [int(m) for m in re.findall(r"mem_mb=(\d+)", p.stdout + p.stderr)]
    assert asked and max(asked) * 2**20 >= 2 * host, (asked, host)

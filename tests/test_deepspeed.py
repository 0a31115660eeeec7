"""DeepSpeed ZeRO 0-3: generated config, launch forms, and real 2-rank runs on CPU (gloo)."""

import dataclasses
import json

import numpy as np
import pytest

from trainscale.launch.supervise import Environment, command
from trainscale.measure import metrics
from trainscale.plan import fit
from trainscale.plan.deepspeed_config import ds_config, load_fragment, merge
from trainscale.plan.matrix import ConfigError, build_runs
from trainscale.plan.preflight import memory
from trainscale.plan.studyconfig import Memory

import tap
from conftest import ROOT, launch, load_yaml, validated


def make(strategy="deepspeed-zero2", workers=2, batch=64, precision="fp32", **kw):
    m = {
        "strategy": [strategy],
        "model": ["seed-small"],
        "dataset": ["digits"],
        "workers": [workers],
        "batch_size": [batch],
        "precision": [precision],
    }
    runs, _ = build_runs(validated({"study": "t", "matrix": m, **kw}))
    return runs[0]


def test_ds_config_follows_the_spec():
    s = make("deepspeed-zero3", workers=4, batch=64, precision="bf16", grad_accum=2)
    c = ds_config(s)
    assert c["train_batch_size"] == 64
    assert c["train_micro_batch_size_per_gpu"] == 8  # 64 / 4 workers / 2 accumulation steps
    assert c["gradient_accumulation_steps"] == 2
    assert c["zero_optimization"] == {"stage": 3}
    assert c["bf16"] == {"enabled": True} and c["fp16"]["enabled"] is False
    assert c["gradient_clipping"] == 0.0 and "optimizer" not in c
    fp16 = ds_config(make("deepspeed-zero0", precision="fp16"))
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0  # dynamic scaling


def test_fragment_is_merged_on_top_and_may_not_touch_the_study(tmp_path):
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": 4}) == {
        "a": {"b": 1, "c": 3},
        "d": 4,
    }
    frag = tmp_path / "ds.yaml"
    frag.write_text("zero_optimization: {overlap_comm: true}\ngradient_clipping: 1.0\n")
    c = ds_config(make("deepspeed-zero2"), load_fragment(str(frag)))
    assert c["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert c["gradient_clipping"] == 1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train_batch_size": 8, "optimizer": {"type": "Adam"}}))
    with pytest.raises(ValueError, match="train_batch_size, optimizer"):
        load_fragment(str(bad))


def test_grad_accum_must_divide_the_per_worker_batch():
    with pytest.raises(ConfigError, match="grad_accum 3 does not divide the per-worker batch 32"):
        make("deepspeed-zero1", grad_accum=3)
    with pytest.raises(ConfigError, match="grad_accum 3 does not divide the per-worker batch 32"):
        make("torch-ddp", grad_accum=3)  # every PyTorch-family strategy accumulates
    assert make("torch-ddp", grad_accum=2).grad_accum == 2


def test_missing_deepspeed_config_is_an_error_before_any_job(tmp_path):
    with pytest.raises(ConfigError, match=r"deepspeed_config: .*nope.yaml does not exist"):
        make(deepspeed_config=str(tmp_path / "nope.yaml"))


def test_launch_forms():
    s = make("deepspeed-zero3", workers=4)
    local = command(s, Environment(mode="local", python="py", cache_dir="/w/.cache"), "m.json")
    assert "TORCH_EXTENSIONS_DIR=/w/.cache/torch_extensions" in local
    assert "--nproc-per-node=4" in local and "--rdzv-endpoint=127.0.0.1:0" in local
    multi = dataclasses.replace(s, nodes=2, world_size=8)
    slurm = Environment(mode="slurm", python="py", nodes=("g1", "g2"), port=2950, job_id="7")
    argv = command(multi, slurm, "m.json")
    i = argv.index("srun")
    assert argv[i : i + 6] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=4",
        "--kill-on-bad-exit=1",
    ]
    assert "--rdzv-endpoint=g1:2950" in argv and "--nnodes=2" in argv


#: ZeRO against its reference: the stages reduce (0-1: all-reduce; 2-3: reduce-scatter) and
#: average four quarter-batch gradients (2 ranks × 2 accumulated micro-batches) where one
#: process averages all 64, and update flat fp32 partitions: the same numbers up to float32
#: rounding. Measured largest difference after 44 SGD steps: 3e-8 at every stage without
#: accumulation, 1.5e-7 (ZeRO 0-1) and 1.8e-7 (2-3) with it; rtol 1e-4 / atol 1e-5 allow 50×
#: that and stay far below a wrong update: a summed gradient takes 2× steps (with momentum too:
#: its buffer is linear in the gradient), a difference of the order of the whole training move,
#: which is checked to be ≥ 0.02. (Adam's partitioned state is checked against one process in
#: tests/test_knobs.py.)
RTOL, ATOL = 1e-4, 1e-5


def run_tapped(tmp_path, s, name):
    """One run with the test plug-in: its record, final and initial weights (numpy)."""
    out, taps = tmp_path / name / "metrics.json", tmp_path / name
    p = launch(s, out, **tap.env(taps))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    return rec, tap.final_weights(taps, s.strategy), tap.initial_weights(taps)


def assert_same_training(got: tuple, want: tuple, what: str) -> None:
    (_, final, init), (_, want_final, want_init) = got, want
    assert final.keys() == want_final.keys(), what
    for k in want_init:
        np.testing.assert_array_equal(init[k], want_init[k], err_msg=f"{what} initial {k}")
    worst = max(float(np.abs(final[k] - want_final[k]).max()) for k in want_final)
    print(f"largest difference {what} - torch: {worst:.2e}")
    for k in want_final:
        np.testing.assert_allclose(final[k], want_final[k], rtol=RTOL, atol=ATOL, err_msg=k)


@pytest.mark.slow
def test_every_zero_stage_trains_one_process_weights_with_sgd(tmp_path, deepspeed_study):
    """ZeRO 0-3 with 2 ranks × 2 accumulated micro-batches of 16 (the study's fp32 runs,
    conftest.deepspeed_study) against one process × 64, SGD with momentum: a summed instead of
    averaged gradient shows (the momentum buffer is linear in the gradient), and so does a
    partitioned optimizer state (ZeRO 1-3 keep each rank's share of the momentum) that is
    stepped, saved or restored wrongly. The same weights from the same start, after training
    that moved them; each stage's samples and throughput against the fed batches."""
    cfg = load_yaml(ROOT / ".test" / "deepspeed.yaml")
    one = {**cfg["matrix"], "strategy": ["torch"], "workers": [1], "precision": ["fp32"]}
    del one["exclude"]
    (spec,), _ = build_runs(validated({**cfg, "grad_accum": 1, "matrix": one}))
    ref = run_tapped(tmp_path, spec, "torch")
    tap.assert_moved(ref[2], ref[1], "torch")
    runs = {r["spec"]["strategy"]: (r, deepspeed_study["taps"][f])
            for r, f in deepspeed_study["recs"] if r["spec"]["precision"] == "fp32"}  # fmt: skip
    assert sorted(runs) == [f"deepspeed-zero{stage}" for stage in range(4)]
    for stage in (0, 1, 2, 3):
        rec, taps = runs[f"deepspeed-zero{stage}"]
        assert rec["status"] == "ok", rec["error"]
        assert rec["deepspeed"]["config"]["zero_optimization"]["stage"] == stage
        assert rec["memory"]["zero_estimate_bytes"] > 0
        tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step=4)
        got = rec, tap.final_weights(taps, rec["spec"]["strategy"]), tap.initial_weights(taps)
        assert_same_training(got, ref, f"ZeRO-{stage}")


@pytest.mark.slow
def test_zero3_bf16_with_accumulation_and_a_fragment(tmp_path, monkeypatch):
    """Also: planned with memory.check warn and a limit its whole-model replica would exceed,
    the run skips the exposed-communication step and says why (issue 59)."""
    frag = tmp_path / "frag.yaml"
    frag.write_text("zero_optimization:\n  stage3_param_persistence_threshold: 0\n")
    s = make("deepspeed-zero3", precision="bf16", grad_accum=2, deepspeed_config=str(frag))
    monkeypatch.chdir(tmp_path)  # the planner's cache and index
    check = memory.resolve(Memory.of({"limit_gib": 0.001, "check": "warn"}), "cpu")
    _, _, predicted = fit.within_limits(check, [s], [], "cpu")
    index = memory.write_index("t", predicted, [s])
    out, taps = tmp_path / "metrics.json", tmp_path / "tap"
    p = launch(s, out, **tap.env(taps), **{memory.INDEX_ENV: str(index)})
    assert p.returncode == 0, p.stderr[-3000:]
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    ds = rec["deepspeed"]
    assert ds["fragment"] == str(frag)
    assert ds["config"]["zero_optimization"] == {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
    }
    assert ds["config"]["gradient_accumulation_steps"] == 2 and ds["config"]["bf16"]["enabled"]
    assert all(ds["breakdown_ms"][k] > 0 for k in ("forward", "backward", "step"))
    # 2 ranks × 2 accumulated micro-batches of 16 per step: 64 samples a step, counted once
    tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step=4)
    # ZeRO-3's training itself is checked against one process in the SGD test above; this bar
    # catches bf16 or accumulation breaking it: measured 0.917 (seed 0; fp32 one process,
    # seeds 0-4: 0.847-0.911, the same 2 epochs at scale 1), chance 0.1
    assert rec["test"]["accuracy"] > 0.8
    assert rec["env"]["frameworks"]["deepspeed"] == "0.19.8"
    # stage 3 with 2 ranks: the estimate divides model states over the 2 devices
    assert rec["memory"]["zero_estimate_bytes"] < 20 * rec["model"]["params"]
    assert rec["memory"]["predicted"]["host_bytes"] == predicted[s.path]["host_bytes"]
    comm = rec["communication"]
    assert comm["method"] is None and comm["compute_seconds_per_step"] is None
    assert comm["skipped"].startswith("not measured: its whole-model replica"), comm


@pytest.mark.slow
def test_deepspeed_study_through_snakemake(deepspeed_study):
    """`.test/deepspeed.yaml` (conftest.deepspeed_study, whose records tests/test_torch_loop.py
    and the SGD test above read too): every stage at fp32 and ZeRO-1 at bf16, with 2
    accumulation steps, ok, and the op built by the deepspeed_ops rule."""
    recs = deepspeed_study["recs"]
    got = sorted((r["spec"]["strategy"], r["spec"]["precision"]) for r, _ in recs)
    assert got == [
        ("deepspeed-zero0", "fp32"),
        ("deepspeed-zero1", "bf16"),
        ("deepspeed-zero1", "fp32"),
        ("deepspeed-zero2", "fp32"),
        ("deepspeed-zero3", "fp32"),
    ]
    for rec, f in recs:
        assert rec["status"] == "ok", (f, rec["error"])
        assert rec["spec"]["grad_accum"] == 2
    built = deepspeed_study["workdir"] / ".cache" / "torch_extensions"
    assert (built / "deepspeed-ops.done").exists()


def test_a_build_lock_left_by_a_dead_build_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch):
    """torch's cpp_extension waits on a lock file forever: one left by a killed build would hang
    every later DeepSpeed run until its timeout."""
    import os

    from trainscale.runners.torch.deepspeed_zero import STALE_LOCK_SECONDS, clear_stale_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    dead, live = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "other_op" / "lock"
    for lock in (dead, live):
        lock.parent.mkdir()
        lock.touch()
    now = dead.stat().st_mtime + STALE_LOCK_SECONDS + 1
    os.utime(live, (now - 5, now - 5))  # a build that started 5 s ago
    assert clear_stale_build_locks(now) == [dead]
    assert not dead.exists() and live.exists()

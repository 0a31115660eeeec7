"""Short benchmark studies (issue 22): `steps_per_epoch` and `samples`, no evaluation where
accuracy does not apply, training's and evaluation's peak memory apart, the config overlay as
Snakemake applies it, the end-of-run message and the all-reduce benchmark's cap."""

from __future__ import annotations

import copy
import dataclasses
import os
import time

import pytest
import yaml

from trainscale import data
from trainscale.analysis import aggregate
from trainscale.analysis.study import Study
from trainscale.measure import collectives, memory, metrics
from trainscale.plan import check, matrix, overlay
from trainscale.report import endnote
from trainscale.runners.common import evaluates, steps_per_epoch

from conftest import ROOT, launch, snakemake, validated

# --- part 1: steps_per_epoch and samples -------------------------------------------------------


def short_config(**top) -> dict:
    m = {"strategy": ["torch-ddp"], "model": ["resnet50"], "dataset": ["synthetic-imagenet"]}
    m.update(batch_size=[8], workers=[2])
    m.update(top.pop("matrix", {}))
    return validated({"study": "s", "steps_per_epoch": 20, "samples": 160, "matrix": m, **top})


def test_steps_per_epoch_is_a_cap_and_null_keeps_the_whole_data_set():
    assert steps_per_epoch(1437, 2, 32) == 22
    assert steps_per_epoch(1437, 2, 32, None) == 22
    assert steps_per_epoch(1437, 2, 32, 5) == 5
    assert steps_per_epoch(1437, 2, 32, 50) == 22


def test_matrix_carries_steps_and_samples_and_drops_cells_too_short_for_them():
    cfg = short_config(matrix={"batch_size": [8, 16], "workers": [2], "dataset": ["digits"]})
    cfg["matrix"]["dataset"] = ["synthetic-imagenet", "digits"]
    runs, dropped = matrix.build_runs(cfg)
    by = {(r.dataset, r.batch_size): r for r in runs}
    # 160 images at a global batch of 8: 20 steps; at 16 only 10, fewer than asked for
    assert set(by) == {("synthetic-imagenet", 8), ("digits", 8), ("digits", 16)}
    assert all(r.steps_per_epoch == 20 for r in runs)
    assert by["synthetic-imagenet", 8].samples == 160 and by["digits", 8].samples is None
    (d,) = dropped
    assert "steps_per_epoch 20 is more than the 10 steps" in d.reason
    # null: every cell runs its whole data set, as before
    cfg = short_config(steps_per_epoch=None, samples=None)
    runs, _ = matrix.build_runs(cfg)
    assert runs[0].steps_per_epoch is None and runs[0].samples is None


def test_samples_sizes_synthetic_data_only():
    a = data.load("synthetic-imagenet", "data", seed=0, samples=16)
    assert a.train_x.shape == (16, 3, 224, 224) and len(a.test_y) == 16
    assert len(data.load("synthetic-mnist", "data", seed=0).train_y) == 60_000


def test_no_evaluation_on_synthetic_data_else_last_epoch_or_every_epoch_with_a_target():
    spec = matrix.build_runs(short_config())[0][0]
    assert not any(evaluates(spec, True, e) for e in (1, 2))
    assert [evaluates(spec, False, e) for e in (1, 2)] == [False, True]
    target = matrix.build_runs(short_config(target_accuracy=0.5))[0][0]
    assert [evaluates(target, False, e) for e in (1, 2)] == [True, True]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, workers", [("torch-ddp", 2), ("tf", 1)])
def test_runners_time_exactly_steps_per_epoch_and_keep_eval_memory_apart(
    tmp_path, strategy, workers
):
    """A PyTorch and a TensorFlow runner on digits: every epoch runs the configured steps,
    the last one is evaluated and its peak memory recorded apart; on synthetic data nothing
    is evaluated and there is no evaluation peak."""
    m = {"strategy": [strategy], "model": ["seed-small"], "workers": [workers]}
    for dataset in ("digits", "synthetic-mnist"):
        cfg = validated(
            {
                "study": "t",
                "steps_per_epoch": 3,
                "samples": 256,
                "matrix": {**m, "dataset": [dataset], "batch_size": [32]},
            }
        )
        spec = matrix.build_runs(cfg)[0][0]
        out = tmp_path / dataset / "metrics.json"
        p = launch(spec, out)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        rec = metrics.read(out)
        assert rec["status"] == "ok", rec["error"]
        assert [e["steps"] for e in rec["epochs"]] == [3, 3]
        assert [e["samples"] for e in rec["epochs"]] == [96, 96]
        mem = rec["memory"]
        assert mem["peak_host_rss_bytes"] > 0
        if dataset == "digits":
            assert rec["test"]["accuracy"] is not None and mem["eval_peak_host_rss_bytes"] > 0
        else:
            assert rec["data"]["train_samples"] == 256
            assert rec["test"]["accuracy"] is None and mem["eval_peak_host_rss_bytes"] is None


# --- part 2: training's and evaluation's peaks apart -------------------------------------------


@pytest.mark.skipif(not memory.reset_rss_high_water(), reason="kernel cannot reset VmHWM")
def test_phase_peaks_keep_an_evaluations_allocation_out_of_trainings_peak():
    memory.reset_rss_high_water()  # what earlier tests in this process used is not this test's
    peaks = memory.PhasePeaks()
    peaks.evaluation_starts()
    big = bytearray(300 * 2**20)  # 300 MiB resident during the "evaluation", freed after it
    big[::4096] = b"x" * len(big[::4096])
    del big
    peaks.evaluation_ends()
    train_rss, _, eval_rss, _ = peaks.finish()
    assert eval_rss >= train_rss + 250 * 2**20
    block = memory.memory_block([train_rss, 0, eval_rss, 0], device=False)
    assert block["eval_peak_host_rss_bytes"] == int(eval_rss) and block["peak_device_bytes"] is None
    assert memory.memory_block([1.0, 0, 0, 0], device=False)["eval_peak_host_rss_bytes"] is None


def test_training_ends_keeps_what_the_process_held_before_its_cache_is_emptied():
    """Lightning's teardown empties CUDA's cache between `fit` and evaluation: NVML's figure for
    the process, read at evaluation's start, is then its leftovers, not training's."""
    nvml = iter([20.0, 2.0, 2.0, 2.0])  # training's blocks, then the emptied cache
    before = memory.PhasePeaks(reserved_peak=lambda: 19.0, process_bytes=lambda: next(nvml))
    before.training_ends()
    before.evaluation_starts()
    before.evaluation_ends()
    before.finish()
    assert before.gpu_held() == [19.0, 20.0]
    nvml = iter([2.0, 2.0, 2.0])
    after = memory.PhasePeaks(reserved_peak=lambda: 19.0, process_bytes=lambda: next(nvml))
    after.evaluation_starts()  # without it: the leftovers, below the reserved peak
    assert after.gpu_held() == [19.0, 2.0]


def test_the_ranks_peaks_are_maxed_and_an_unread_figure_stays_unread():
    """Every rank's row (PhasePeaks.finish, then gpu_held), as the runners gather them: a
    figure one rank could not read (NaN) is the others' maximum, and null where none read it."""
    nan = float("nan")
    rows = [[10.0, 7.0, 0.0, 0.0, 9.0, nan], [12.0, 5.0, 0.0, 0.0, nan, nan]]
    block = memory.ranks_memory(rows, device=True)
    assert block["peak_host_rss_bytes"] == 12 and block["peak_device_bytes"] == 7
    assert block["peak_reserved_bytes"] == 9 and block["peak_nvml_process_bytes"] is None
    assert block["per_rank_host_rss_bytes"] == [10, 12] and block["per_rank_device_bytes"] == [7, 5]
    assert memory.ranks_memory(rows, device=False)["per_rank_device_bytes"] is None


# --- part 3: the config overlay ----------------------------------------------------------------


def test_overlay_merges_like_snakemake_but_replaces_the_matrix_as_a_whole():
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    study = {"study": "x", "optimizer": {"lr": 0.01}, "matrix": {"strategy": ["tf"]}}
    merged = overlay.overlay(base, study)
    assert merged["optimizer"] == {**base["optimizer"], "lr": 0.01}  # nested: merged
    assert merged["matrix"] == {"strategy": ["tf"]}  # no inherited exclude, model, ...
    assert base["optimizer"]["lr"] == 0.001  # the inputs are left alone
    keys = dict(overlay.inherited(base, study))
    assert keys["optimizer.name"] == "adam" and keys["target_accuracy"] == 0.9
    assert "matrix" not in keys and "optimizer.lr" not in keys and "study" not in keys


def test_checker_lists_inherited_keys_and_rejects_a_file_without_study(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"study": "mine", "epochs": 2, "matrix": short_matrix()}))
    assert check.main(["--no-memory", str(good)]) == 0
    out = capsys.readouterr().out
    assert "inherited from" in out and "target_accuracy: 0.9" in out and "optimizer:" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"epochs": 2, "matrix": short_matrix()}))
    assert check.main(["--no-memory", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad} does not name its own study" in err and "results/showcase/" in err


def short_matrix() -> dict:
    # config.yaml excludes {strategy: tf, batch_size: 64}: merged, this matrix would be empty
    return {"strategy": ["tf"], "model": ["seed-small"], "dataset": ["digits"], "batch_size": [64]}


def test_workflow_stops_a_configfile_without_study_and_uses_the_files_matrix_whole(tmp_path):
    bad = tmp_path / "nostudy.yaml"
    bad.write_text(yaml.safe_dump({"matrix": short_matrix()}))
    p = snakemake(tmp_path, "-n", "--configfile", str(bad))
    text = p.stdout + p.stderr
    assert p.returncode != 0 and f"{bad} does not name its own study" in text, text[-2000:]
    assert not (tmp_path / "results").exists()
    good = tmp_path / "study.yaml"
    good.write_text(yaml.safe_dump({"study": "own", "matrix": short_matrix()}))
    p = snakemake(tmp_path, "-n", "--configfile", str(good))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "trainscale: study 'own': 1 runs" in p.stderr


# --- part 4: the end-of-run message ------------------------------------------------------------


def test_end_message_names_only_outputs_as_new_as_the_runs(tmp_path):
    res = tmp_path / "results" / "s"
    run = res / "runs" / "a" / "metrics.json"
    run.parent.mkdir(parents=True)
    run.write_text("{}")
    text = endnote.message("s", res)  # as after --until train: runs only
    assert "1 × " in text and "summary.txt" not in text.split("not built")[0]
    assert "not built, or older than the runs: summary.txt, report.html, runs.csv" in text
    for name in ("summary.txt", "report.html", "runs.csv", "scaling.csv"):
        (res / name).write_text("the answer\n")
    text = endnote.message("s", res)
    assert "not built" not in text and text.index("the answer") < text.index("results of study")
    assert text.rstrip().endswith("the terminal shows them with `--quiet host`)")  # where, last
    later = time.time() + 10  # a run redone after the summary: the summary no longer covers it
    os.utime(run, (later, later))
    assert "not built, or older than the runs: summary.txt" in endnote.message("s", res)


def test_end_message_leaves_the_table_of_every_cell_to_the_summary_file(tmp_path):
    res = tmp_path / "results" / "s"
    (res / "runs" / "a").mkdir(parents=True)
    (res / "runs" / "a" / "metrics.json").write_text("{}")
    summary = ["trainscale study 's': 1 runs", "", "fastest strategy per model: torch", "",
               "strategy   model   dataset   N", "torch      seed    digits    1", "",
               "failed runs:", "  [failed] b: OOM"]  # fmt: skip
    for name in ("report.html", "runs.csv", "scaling.csv"):
        (res / name).write_text("")
    (res / "summary.txt").write_text("\n".join(summary) + "\n")
    text = endnote.message("s", res)
    assert "fastest strategy per model: torch" in text and "[failed] b: OOM" in text
    assert "torch      seed" not in text
    assert f"every cell's figures, a line each: {res / 'summary.txt'}" in text
    assert "logs/s/ (each job's), .snakemake/log/" in text


# --- part 5: the all-reduce benchmark's cap ----------------------------------------------------


def test_collectives_stop_at_the_gradient_or_at_max_bytes_when_smaller():
    grad = 100 * 2**20 + 5  # just over 100 MiB
    full, cut = collectives.planned_sizes(grad, None)
    assert full[-1] == 128 * 2**20 and full[-2] < grad and not cut
    capped, cut = collectives.planned_sizes(grad, 10**6)
    assert capped[-1] == 2**19 and cut  # the largest power of 2 at or below the cap
    same, cut = collectives.planned_sizes(2**20, 2**21)
    assert same[-1] == 2**20 and not cut  # a cap above the gradient changes nothing
    cfg = copy.deepcopy(validated({"study": "s", "matrix": short_matrix()}))
    assert cfg["collectives"]["max_bytes"] is None


def test_collectives_benchmark_sizes_for_the_gradients_of_multi_worker_cells_only(tmp_path):
    """ResNet-50 on one worker reduces no gradient: the benchmark (2 workers) stops at
    seed-small's, and collectives.max_bytes reaches its command line."""
    cfg = tmp_path / "c.yaml"
    m = {"strategy": ["torch", "torch-ddp"], "model": ["seed-small", "resnet50"]}
    m.update(dataset=["digits"], workers=[1, 2], batch_size=[64])
    m["exclude"] = [{"model": "resnet50", "workers": 2}, {"strategy": "torch-ddp", "workers": 1}]
    cfg.write_text(yaml.safe_dump({"study": "c", "collectives": {"max_bytes": 4096}, "matrix": m}))
    p = snakemake(tmp_path, "results/c/collectives.csv", "-n", "-p", "--configfile", str(cfg))
    assert p.returncode == 0, p.stderr[-2000:]
    (line,) = [ln for ln in p.stdout.splitlines() if "-m trainscale.runners.collectives" in ln]
    assert "--model seed-small:digits" in line and "resnet50" not in line
    assert "--max-bytes 4096" in line
    assert "stops at collectives.max_bytes = 4096 bytes" in p.stdout + p.stderr


def test_communication_model_counts_the_steps_run_and_says_when_the_benchmark_was_cut(tmp_path):
    """2-worker DDP cell, 1000 samples at 32 per worker (15 steps) cut to 5 steps per epoch; a
    benchmark that stopped at 2 KiB below the 4000-byte gradient."""
    from test_aggregate import ok_record, spec_for, write
    from test_collectives import fake_collectives

    paths = []
    for workers in (1, 2):
        s = dataclasses.replace(spec_for("torch-ddp", workers), steps_per_epoch=5)
        paths.append(write(tmp_path / "runs", s, ok_record(s, [1.0, 1.0])))
    study = Study.build(paths)
    bench = fake_collectives(tmp_path / "c.json", {1024: [1e-3] * 3, 2048: [1e-3] * 3})
    comm = aggregate.communication_frame(
        study.scaling, study.runs, aggregate.collectives_frame([bench])
    )
    (row,) = comm.itertuples()
    assert row.steps_per_epoch == 5 and row.measured_step_seconds == pytest.approx(1.0 / 5)
    assert "read at 2048 bytes" in row.note and "collectives.max_bytes" in row.note

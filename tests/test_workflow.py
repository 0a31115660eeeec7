"""The workflow as a user runs it: snakemake dry-runs, bad configs, and a real small study."""

import csv
import re
from pathlib import Path

import pytest
import yaml

from trainscale.measure import metrics
from trainscale.runners.guarded import PARTS

from conftest import ROOT, snakemake


def write_config(tmp_path: Path, **overrides) -> Path:
    cfg = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())
    cfg.update(overrides)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("config", ["config.yaml", ".test/config.yaml"])
def test_dry_run_of_shipped_configs(tmp_path, config):
    p = snakemake(tmp_path, "-n", "--configfile", str(ROOT / config))
    assert p.returncode == 0, p.stderr
    assert "trainscale: study" in p.stderr and "train " in p.stdout


def test_real_dataset_runs_depend_on_the_download_rule(tmp_path):
    cfg = write_config(
        tmp_path,
        matrix={"strategy": ["torch"], "model": ["seed-small"], "dataset": ["mnist", "digits"]},
    )
    p = snakemake(tmp_path, "-n", "--configfile", str(cfg))
    assert p.returncode == 0, p.stderr
    assert "download_mnist" in p.stdout and "download_cifar10" not in p.stdout


@pytest.mark.parametrize(
    "matrix, needle",
    [
        (
            {
                "strategy": ["torch-ddp"],
                "model": ["seed-small"],
                "dataset": ["digits"],
                "workers": [3],
                "batch_size": [64],
            },
            "does not split over 3 workers",
        ),
        ({"strategy": ["torch"], "model": ["seed-smal"], "dataset": ["digits"]}, "seed-smal"),
    ],
)
def test_bad_config_fails_before_any_job_with_a_message(tmp_path, matrix, needle):
    p = snakemake(tmp_path, "-n", "--configfile", str(write_config(tmp_path, matrix=matrix)))
    assert p.returncode != 0
    assert needle in p.stderr + p.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_real_study_through_snakemake(torch_study):
    """`.test/config.yaml`: torch and torch-ddp on 1 and 2 workers, digits, for real (the
    study is conftest.torch_study, whose records tests/test_aggregate.py reads too)."""
    work, results = torch_study["workdir"], torch_study["results"]
    assert results == work / "results" / "ci-torch"
    files = torch_study["files"]
    assert len(files) == 3  # torch w1, torch-ddp w1, torch-ddp w2
    for f in files:
        rec = metrics.read(f)
        assert rec["status"] == "ok", rec["error"]
        assert rec["throughput"] > 0 and rec["first_epoch_seconds"] > 0
        # chance is 0.1; measured for seeds 0-4 (Adam, 2 epochs, scale 2, global batch 64, the
        # same for all three runs): 0.925-0.944, 0.939 at seed 0; 0.88 leaves ~2 ranges' margin
        assert rec["test"]["accuracy"] > 0.88
        assert rec["epochs"][1]["train_loss"] < rec["epochs"][0]["train_loss"]
        log = (
            work
            / "logs"
            / "ci-torch"
            / "runs"
            / (f.parent.relative_to(results / "runs").as_posix() + ".log")
        )
        assert "trainscale: launching:" in log.read_text()
    rows = list(csv.DictReader((results / "runs.csv").open()))
    assert len(rows) == 3 and {r["status"] for r in rows} == {"ok"}
    assert {r["spec.world_size"] for r in rows} == {"1", "2"}
    assert "results of study 'ci-torch' are in results/ci-torch/" in torch_study["output"]
    # exposed communication in the multi-worker run; predictions beside, never in, the tables
    (two,) = [metrics.read(f) for f in files if "workers~2" in str(f)]
    comm = two["communication"]
    assert comm["method"] == "ddp-no_sync" and comm["exposed_seconds_per_step"] >= 0
    assert comm["compute_seconds_per_step"] > 0  # as many no-sync steps as epoch 2, ≤ 20
    assert comm["steps"] == min(20, two["epochs"][1]["steps"]) >= 3
    pred = list(csv.DictReader((results / "predictions.csv").open()))
    predicted = [r for r in pred if r["basis"] == "predicted"]
    assert {int(r["world_size"]) for r in predicted} == {4, 8, 16, 32, 64}  # 128+: batch 64
    for r in predicted:
        assert float(r["throughput_lo"]) <= float(r["throughput_pred"]) <= float(r["throughput_hi"])
    (check,) = list(csv.DictReader((results / "prediction_check.csv").open()))
    assert check["world_size"] == "2" and check["fitted_on"] == "1" and check["error_pct"]
    print(f"leave-one-out, torch-ddp N=2 from N=1: error {float(check['error_pct']):+.1f} %")
    scaling = list(csv.DictReader((results / "scaling.csv").open()))
    assert {r["world_size"] for r in scaling} == {"1", "2"}
    assert "N=4" not in (results / "summary.txt").read_text()
    assert "Predicted scaling" in (results / "report.html").read_text()
    # memory predicted before any job (memory: check warn), beside the measured peaks
    recs = [metrics.read(f) for f in files]
    assert all(r["memory"]["predicted"]["method"] == "traced" for r in recs)
    assert all(r["memory"]["predicted"]["limit_bytes"] == 4 * 2**30 for r in recs)
    ddp = {r["spec"]["workers"]: r["memory"]["predicted"]["total_bytes"] for r in recs
           if r["spec"]["strategy"] == "torch-ddp"}  # fmt: skip
    assert ddp[2] < ddp[1]  # half the batch per rank, the same buckets
    assert all(float(r["predicted_peak_bytes"]) > 0 and r["memory_error"] == "" for r in rows)
    assert all(float(r["predicted_peak_bytes"]) > 0 for r in scaling)
    assert "predicted peak per rank" in (results / "report.html").read_text()
    # where each run's time went: the supervisor's and rank 0's moments in order, the set-up's
    # phases adding up to setup_seconds, each measurement after training timed
    for r in recs:
        t, eps = r["timeline"], 0.05  # a process's start is known to the kernel's 10 ms tick
        started = t["supervisor_start_unix"]
        assert started - eps <= t["launched_unix"] <= t["worker_start_unix"] + eps
        assert t["worker_start_unix"] <= t["recorder_unix"] <= t["record_unix"]
        assert t["record_unix"] <= t["written_unix"] + eps <= t["exited_unix"] + 2 * eps
        assert set(t["set_up"]) == {"rendezvous", "data", "model", "other"}
        assert abs(sum(t["set_up"].values()) - r["setup_seconds"]) < 0.01
        assert {"evaluation", "memory", "flops"} <= set(t["parts"]) <= set(PARTS)
    assert not any(c.startswith("timeline") for c in rows[0])  # not a table's column
    # one progress line per finished run, from Snakemake's side (trainscale.launch.progress)
    lines = [ln for ln in torch_study["output"].splitlines() if ln.startswith("trainscale: [")]
    assert [ln.split("]")[0] for ln in lines] == [f"trainscale: [{i}/3" for i in (1, 2, 3)]
    assert all(re.search(r"\] ok torch(-ddp)? workers=[12]: [0-9,]+ samples/s, job ", ln)
               for ln in lines), lines  # fmt: skip
    assert "to go, about" in lines[0] and lines[-1].endswith("; 0 to go")
    # not Snakemake's block per job (the profile's quiet setting), which its log file keeps
    assert not re.search(r"^(local)?rule \w+:", torch_study["output"], re.M)
    (kept,) = [p.read_text() for p in (work / ".snakemake" / "log").glob("*.snakemake.log")
               if "rule train:" in p.read_text()]  # fmt: skip
    assert "Finished jobid" in kept
    # nothing to do the second time: every result is kept
    again = snakemake(
        work, "--cores", "2", "-n", "--configfile", str(ROOT / ".test" / "config.yaml")
    )
    assert "Nothing to be done" in again.stdout + again.stderr


def test_predictions_are_on_by_default_and_can_be_turned_off(tmp_path):
    quiet = ("--quiet", "host")  # the job blocks shown (docs/config.md)
    on = snakemake(tmp_path, "-n", *quiet, "--configfile", str(ROOT / ".test" / "config.yaml"))
    assert on.returncode == 0, on.stderr
    assert "prediction_check.csv" in on.stdout
    cfg = write_config(tmp_path, predict={"enabled": False})
    off = snakemake(tmp_path, "-n", *quiet, "--configfile", str(cfg))
    assert off.returncode == 0, off.stderr
    assert "prediction_check.csv" not in off.stdout and "report.html" in off.stdout


def test_every_run_path_matches_the_run_wildcard(tmp_path):
    """Matrix values with '_' (batch_mode per_worker) once fell outside the `run` wildcard's
    constraint: Snakemake then found no rule for those runs."""
    cfg = write_config(
        tmp_path,
        matrix={
            "strategy": ["torch-ddp"],
            "model": ["seed-small"],
            "dataset": ["digits"],
            "batch_mode": ["global", "per_worker"],
            "workers": [2],
            "precision": ["fp32", "bf16"],
            "exclude": [],
        },
    )
    p = snakemake(tmp_path, "-n", "--configfile", str(cfg))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "train                    4" in p.stdout, p.stdout

"""Bad input stops the workflow before any job starts, with a message naming the key (or file)
and the fix; a bad metrics file among good ones is listed, not fatal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from trainscale.analysis import aggregate
from trainscale.analysis.study import Study
from trainscale.plan import check, machine, matrix

from conftest import ROOT, shipped_studies_cwd, snakemake, validated

GOOD = {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"], "exclude": []}


def config_file(tmp_path: Path, matrix_: dict | None = None, **top) -> Path:
    cfg = {"study": "bad", "matrix": {**GOOD, **(matrix_ or {})}, **top}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def fails_before_any_job(tmp_path: Path, cfg: Path, *needles: str, real: bool = False) -> str:
    args = ["--cores", "2"] if real else ["-n"]
    p = snakemake(tmp_path, *args, "--configfile", str(cfg))
    text = p.stdout + p.stderr
    assert p.returncode != 0, text[-2000:]
    for needle in needles:
        assert needle in text, (needle, text[-3000:])
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()
    return text


@pytest.mark.parametrize(
    "matrix_, top, needles",
    [
        ({"strategy": ["torch-ddpp"]}, {}, ["matrix.strategy[0]", "'torch-ddpp'", "'torch-ddp'"]),
        ({"model": ["resnet"]}, {}, ["matrix.model[0]", "'resnet'", "resnet50"]),
        ({"dataset": ["mnst"]}, {}, ["matrix.dataset[0]", "did you mean 'mnist'"]),
        ({"batch_size": [0]}, {}, ["matrix.batch_size[0]", "minimum of 1"]),
        ({"batch_size": [-64]}, {}, ["matrix.batch_size[0]", "-64"]),
        ({"precision": ["fp8"]}, {}, ["matrix.precision[0]", "'fp8'", "bf16"]),
        ({}, {"epoch": 3}, ["epoch: unknown key; did you mean 'epochs'?"]),
        ({"strategy": ["torch"], "exclud": []}, {}, ["matrix.exclud: unknown key", "'exclude'"]),
        ({}, {"study": "../etc"}, ["study: '../etc' has characters not allowed"]),
        ({}, {"study": "a;rm -rf ~"}, ["study:", "characters not allowed"]),
        ({}, {"data_dir": "data $(id)"}, ["data_dir:", "characters not allowed"]),
        (
            {"strategy": ["torch-ddp"], "workers": [3], "batch_size": [64]},
            {},
            ["matrix.batch_size 64", "does not split over 3 workers", "multiple of 3"],
        ),
        (
            {"strategy": ["torch"], "workers": [2]},
            {},
            ["matrix is empty", "widen matrix or shorten matrix.exclude"],
        ),
        (
            {"strategy": ["deepspeed-zero2"], "workers": [2]},
            {"deepspeed_config": "nowhere/ds.json"},
            ["deepspeed_config: nowhere/ds.json does not exist", "or remove the key"],
        ),
        (
            {"strategy": ["torch-ddp"], "workers": [2]},
            {"faults": [{"match": {"strategy": "torch-ddp"}, "kind": "raise", "rank": 2}]},
            ["faults[0].rank 2 does not exist", "use a rank below 2"],
        ),
        (
            {},
            {"faults": [{"match": {"strategy": "tf"}, "kind": "hang"}]},
            ["faults[0].match", "matches no run"],
        ),
        (
            {},
            {"cost": {"device_hour": {"H100": 2.49}}},
            ["cost.device_hour (H100) has no 'cpu-core' price", "add `cpu-core:"],
        ),
        ({}, {"report": {"rank_by": "cost"}}, ["report.rank_by: cost needs prices"]),
    ],
    ids=[
        "unknown-strategy",
        "unknown-model",
        "unknown-dataset",
        "zero-batch",
        "negative-batch",
        "unknown-precision",
        "top-level-typo",
        "matrix-typo",
        "study-path-traversal",
        "study-shell-metachars",
        "data-dir-shell-metachars",
        "indivisible-batch",
        "empty-matrix",
        "missing-deepspeed-config",
        "fault-rank-out-of-range",
        "fault-matches-nothing",
        "cpu-study-without-cpu-core-price",
        "rank-by-cost-without-prices",
    ],
)
def test_bad_config_stops_before_any_job_naming_key_and_fix(tmp_path, matrix_, top, needles):
    fails_before_any_job(tmp_path, config_file(tmp_path, matrix_, **top), *needles)


def test_malformed_yaml_stops_snakemake_and_the_checker_names_file_and_line(tmp_path, capsys):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("study: s\nmatrix:\n  strategy: [torch\n  model: [seed-small]\n")
    # Snakemake reads --configfile before any of the workflow's code runs, and only says:
    fails_before_any_job(tmp_path, cfg, "Config file is not valid JSON or YAML")
    # ... so the README points to the checker, which names the file and the line
    assert check.main([str(cfg)]) == 1
    err = capsys.readouterr().err
    assert f"{cfg}: line 4, column" in err and "not valid YAML" in err


def test_config_checker_accepts_the_shipped_configs(capsys, tmp_path, monkeypatch):
    # .test/imagedata.yaml reads `snakemake export_data`'s output, .test/thirdparty.yaml imports
    # from .test/models, both relative to where it runs
    shipped_studies_cwd(tmp_path)
    monkeypatch.chdir(tmp_path)
    configs = [ROOT / "config.yaml", *sorted((ROOT / ".test").glob("*.yaml"))]
    assert check.main(["--no-memory", *(str(c) for c in configs)]) == 0
    summaries = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith(" ")]
    assert len(summaries) == len(configs)  # one line each, then the keys it inherits


@pytest.mark.skipif(machine.gpu_count() > 0, reason="checks the CPU-only form")
def test_more_workers_than_the_machine_has_stops_before_any_job(tmp_path):
    workers = (os.cpu_count() or 1) + 1
    cfg = config_file(
        tmp_path, {"strategy": ["torch-ddp"], "workers": [workers], "batch_mode": ["per_worker"]}
    )
    fails_before_any_job(
        tmp_path,
        cfg,
        f"matrix.workers [{workers}]",
        f"this machine has {os.cpu_count()} CPU cores",
        "--profile profiles/slurm",
        real=True,
    )


def test_runs_across_nodes_without_a_cluster_stop_before_any_job(tmp_path):
    cfg = config_file(tmp_path, {"strategy": ["torch-ddp"], "nodes": [2]})
    fails_before_any_job(tmp_path, cfg, "matrix.nodes [2]", "--profile profiles/slurm", real=True)


def test_capacity_problems_for_gpus():
    runs, _ = matrix.build_runs(
        validated({"study": "g", "matrix": {**GOOD, "strategy": ["torch-ddp"], "workers": [4]}}),
        "cuda",
    )
    assert machine.capacity_problems(runs, "cuda", cpus=64, gpus=8) == []
    (msg,) = machine.capacity_problems(runs, "cuda", cpus=64, gpus=2)
    assert "matrix.workers [4]" in msg and "2 GPUs" in msg
    (msg,) = machine.capacity_problems(runs, "cuda", cpus=64, gpus=0)
    assert msg.startswith("accelerator: cuda, and this machine has no CUDA GPU visible")


def test_every_problem_is_listed_at_once():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    cfg = {"study": "s", "epoch": 2, "matrix": {**GOOD, "batch_size": [0], "model": ["vgg"]}}
    problems = check.config_problems(cfg, schema)
    assert len(problems) == 3, problems
    assert check.config_problems({"study": "s", "matrix": GOOD}, schema) == []


def test_invalid_metrics_files_are_listed_and_the_rest_aggregated(tmp_path):
    from test_aggregate import ok_record, spec_for, write

    s = spec_for("torch", 1)
    write(tmp_path / "runs", s, ok_record(s, [1.0, 1.0]))
    bad_json = tmp_path / "runs" / "strategy~torch" / "b" / "metrics.json"
    bad_json.parent.mkdir(parents=True)
    bad_json.write_text("{not json")
    bad_schema = tmp_path / "runs" / "strategy~torch" / "c" / "metrics.json"
    bad_schema.parent.mkdir(parents=True)
    bad_schema.write_text('{"schema": "trainscale.metrics/1", "status": "fine"}')
    records, invalid = aggregate.load(aggregate.find_metrics(tmp_path / "runs"))
    assert len(records) == 1
    why = dict(invalid)
    assert "not readable JSON" in why[str(bad_json)]
    assert "'spec' is a required property" in why[str(bad_schema)]


def test_study_name_and_errors_are_escaped_in_the_report(tmp_path):
    """Names reach the report also from metrics files gathered elsewhere, unchecked by the
    config schema: the report escapes them."""
    from test_aggregate import failed_record, spec_for, write

    from trainscale.report import html as report

    xss = "<script>alert(1)</script>"
    s = spec_for("torch", 1)
    write(tmp_path / "runs", s, failed_record(s, "failed", f"ValueError: {xss}"))
    study = Study.build(aggregate.find_metrics(tmp_path / "runs"), name=f"s{xss}")
    report.write_html(study, tmp_path / "report.html", None)
    page = (tmp_path / "report.html").read_text()
    assert xss not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_no_unpickling_unsafe_loading_or_shell_strings_in_the_package():
    """Static guard: data and results are never unpickled, torch.load only with
    weights_only=True, and subprocesses get argument lists, not shell strings."""
    import re

    for path in sorted((ROOT / "workflow" / "trainscale").rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"\bpickle\.loads?\(|allow_pickle\s*=\s*True", text), path
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, (path, call)
        assert not re.search(r"shell\s*=\s*True", text), path

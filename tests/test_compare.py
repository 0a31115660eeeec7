"""`python -m trainscale.compare`, references and the scaling card, on one real small study
(torch-ddp at 1 and 2 workers on digits ×4, 2 repeats of 3 epochs, run once for the module
through Snakemake)
and doctored copies of it: a copy is "same", a copy with 2-worker torch-ddp runs made 2× slower
is flagged by name, a single-repeat or failed cell is not comparable, bad input exits 2."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from trainscale.compare import card
from trainscale.compare import cli as compare_cli
from trainscale.measure import metrics

from conftest import PYTHON, ROOT, run_env, snakemake

# a planted 2x slowdown must stand out of the repeats' spread: measured with nothing beside it
pytestmark = pytest.mark.alone

#: Steady epochs of about a second each (scale 4, epochs 2..3): on a busy 2-core machine the
#: repeats of a 0.1 s epoch differed by 2.1×, more than the 2× slowdown the tests look for.
STUDY = {
    "study": "cmp",
    "epochs": 3,
    "repeats": 2,
    "seed": 0,
    "timeout_minutes": 5,
    "collectives": {"warmup": 1, "iters": 3},
    "matrix": {
        "strategy": ["torch-ddp"],
        "model": ["seed-small"],
        "dataset": ["digits"],
        "scale": [4],
        "batch_size": [64],
        "workers": [1, 2],
        "exclude": [],
    },
}
DDP2 = "strategy~torch-ddp/**/workers~2/**/metrics.json"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """The real study's results folder (4 runs and the all-reduce benchmark)."""
    work = tmp_path_factory.mktemp("study")
    (work / "cfg.yaml").write_text(yaml.safe_dump(STUDY))
    p = snakemake(work, "--cores", "2", "--configfile", str(work / "cfg.yaml"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return work / "results" / "cmp"


def copy_of(study: Path, dest: Path) -> Path:
    shutil.copytree(study, dest)
    return dest


def doctor(folder: Path, pattern: str, factor: float, how: str = "both") -> int:
    """Make the runs matching `pattern` `factor`× slower: their `throughput` fields divided
    ("fields"), their epoch seconds multiplied ("epochs"), or both, consistently."""
    files = sorted(folder.glob(f"runs/{pattern}"))
    for f in files:
        rec = json.loads(f.read_text())
        if how in ("fields", "both"):
            rec["throughput"] /= factor
            rec["throughput_per_worker"] /= factor
        if how in ("epochs", "both"):
            for e in rec["epochs"]:
                e["seconds"] *= factor
                e["samples_per_second"] /= factor
            rec["first_epoch_seconds"] *= factor
            rec["steady_epoch_seconds"] *= factor
        f.write_text(json.dumps(rec))
    return len(files)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "trainscale.compare", *map(str, args)],
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def verdicts(result: dict) -> dict[int, str]:
    return {r["cell"]["workers"]: r["verdict"] for r in result["cells"]}


def test_a_copy_compares_as_same(study, tmp_path, capsys):
    other = copy_of(study, tmp_path / "copy")
    rc = compare_cli.main(
        [
            str(study),
            str(other),
            "--json",
            str(tmp_path / "c.json"),
            "--html",
            str(tmp_path / "c.html"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    result = json.loads((tmp_path / "c.json").read_text())
    assert verdicts(result) == {1: "same", 2: "same"}
    assert all(r["ratio"] == pytest.approx(1) for r in result["cells"])
    assert result["environment"] == [] and "no differences" in out
    page = (tmp_path / "c.html").read_text()
    assert "Content-Security-Policy" in page and "<script" not in page
    assert "torch-ddp seed-small digits N=2" in page
    assert compare_cli.main([str(study), str(other), "--ci", "welch"]) == 0


@pytest.mark.parametrize("how", ["both", "fields", "epochs"])
def test_two_worker_runs_made_2x_slower_are_flagged_by_name(study, tmp_path, how):
    slow = copy_of(study, tmp_path / "slow")
    assert doctor(slow, DDP2, 2.0, how) == 2
    p = cli(study, slow, "--json", tmp_path / "c.json")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "slower: torch-ddp seed-small digits N=2" in p.stdout
    result = json.loads((tmp_path / "c.json").read_text())
    assert verdicts(result) == {1: "same", 2: "slower"}
    (row,) = [r for r in result["cells"] if r["verdict"] == "slower"]
    assert row["ratio"] == pytest.approx(0.5, rel=0.02) and row["ci_high"] < 0.95
    if how != "both":  # one field left as it was: the record contradicts itself, and says so
        assert any("inconsistent metrics" in n for n in row["notes"])
    # within a 60 % threshold a halving is not a regression
    assert compare_cli.main([str(study), str(slow), "--threshold", "0.6"]) == 0


def test_single_repeat_and_failed_cells_are_not_comparable(study, tmp_path, capsys):
    new = copy_of(study, tmp_path / "new")
    doctor(new, DDP2, 2.0)
    for f in new.glob("runs/strategy~torch-ddp/**/workers~2/**/repeat~1/metrics.json"):
        f.unlink()  # the slower cell now has one repeat: no CI, no verdict
    (one,) = new.glob("runs/strategy~torch-ddp/**/workers~1/**/repeat~0/metrics.json")
    rec = metrics.read(one)
    metrics.write(
        one,
        metrics.failure_record(rec["spec"], "failed", "RuntimeError: boom", "", 1.0, rec["launch"]),
    )
    for f in new.glob("runs/strategy~torch-ddp/**/workers~1/**/repeat~1/metrics.json"):
        f.unlink()  # N=1 has no ok run left
    assert compare_cli.main([str(study), str(new), "--json", str(tmp_path / "c.json")]) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    reasons = {r["cell"]["workers"]: (r["verdict"], r["reason"]) for r in result["cells"]}
    assert reasons[2] == ("not comparable", "single repeat in NEW: no confidence interval")
    assert reasons[1] == ("not comparable", "failed in NEW (1 failed)")
    assert "RuntimeError: boom" in json.dumps(result["failures"]["new"]["runs"])
    assert "not comparable" in capsys.readouterr().out


def test_scaling_card_validates_and_two_cards_compare(study, tmp_path):
    schema = yaml.safe_load((ROOT / "workflow/schemas/scaling-card.schema.yaml").read_text())
    written = json.loads((study / "scaling-card.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(written)
    (group,) = written["scaling"]
    assert (group["strategy"], group["model"], group["precision"]) == (
        "torch-ddp",
        "seed-small",
        "fp32",
    )
    assert [p["world_size"] for p in group["by_n"]] == [1, 2]
    assert all(p["throughput"]["n"] == 2 for p in group["by_n"])
    fitted = group[
        "prediction"
    ]  # the step-time model of trainscale.analysis.predict, not a measurement
    assert set(fitted) == {"c0", "c1", "t_fixed", "overlap", "notes"}, fitted
    assert all(math.isfinite(fitted[k]) for k in ("c0", "c1", "t_fixed", "overlap"))
    assert group["by_n"][1]["efficiency"] > 0
    (bench,) = written["collectives"]
    assert (bench["backend"], bench["workers"], bench["nodes"]) == ("gloo", 2, 1)
    assert written["machine"]["versions"]["torch"] and written["failures"]["runs"] == []
    # cluster against cluster: two cards, one from a folder of runs gathered elsewhere
    slow = copy_of(study / "runs", tmp_path / "gathered" / "runs")
    doctor(slow.parent, DDP2, 2.0)
    assert card.main([str(slow.parent), "--out", str(tmp_path / "slow-card.json")]) == 0
    p = cli(study / "scaling-card.json", tmp_path / "slow-card.json")
    assert p.returncode == 1 and "slower: torch-ddp" in p.stdout, p.stdout + p.stderr
    assert cli(study / "scaling-card.json", study).returncode == 0


def test_a_failed_benchmark_is_a_failure_in_the_card_not_bandwidth(study, tmp_path):
    new = copy_of(study, tmp_path / "new")
    (f,) = new.glob("collectives/**/*.json")
    rec = json.loads(f.read_text())
    rec.update(status="failed", error="gloo: connection refused", sizes=[], rank_hosts=["a", "b"])
    f.write_text(json.dumps(rec))
    built = card.build(new)
    assert built["collectives"] == []
    (fail,) = built["failures"]["collectives"]
    assert fail["workers"] == 2 and "connection refused" in fail["error"]
    assert built["machine"]["interconnect"]["peak_busbw_bytes_per_second"] == {}


def test_environment_and_config_differences_are_listed(study, tmp_path, capsys):
    new = copy_of(study, tmp_path / "new")
    for f in new.glob("runs/**/metrics.json"):
        rec = json.loads(f.read_text())
        rec["env"]["frameworks"]["torch"] = "9.9.9"
        rec["spec"]["threads_per_worker"] = 2
        f.write_text(json.dumps(rec))
    assert compare_cli.main([str(study), str(new)]) == 0
    out = capsys.readouterr().out
    assert "torch: 2." in out and "-> 9.9.9" in out
    assert "config: threads_per_worker: 1 -> 2" in out


def test_references_in_reframes_manner(study, tmp_path, capsys):
    measured = {
        p["workers"]: p["throughput"]["mean"]
        for p in json.loads((study / "scaling-card.json").read_text())["scaling"][0]["by_n"]
    }
    refs = tmp_path / "references.yaml"
    refs.write_text(
        yaml.safe_dump(
            {
                "tolerance": [-0.05, None],
                "references": [
                    {"cell": {"strategy": "torch-ddp", "workers": 1}, "throughput": measured[1]},
                    {
                        "cell": {"workers": 2},
                        "throughput": measured[2] * 0.5,
                        "tolerance": [-0.1, 2.0],
                    },
                ],
            }
        )
    )
    ok = cli("--reference", refs, study)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = yaml.safe_load(refs.read_text())
    doc["references"][1]["throughput"] = measured[2] * 3  # expected 3× what was measured
    refs.write_text(yaml.safe_dump(doc))
    slow = cli("--reference", refs, study)
    assert slow.returncode == 1 and "outside bounds: torch-ddp seed-small digits N=2" in slow.stdout
    doc["references"][0]["cell"] = {"strateg": "torch-ddp"}
    refs.write_text(yaml.safe_dump(doc))
    assert compare_cli.main(["--reference", str(refs), str(study)]) == 2
    assert "references[0].cell.strateg: unknown key; did you mean 'strategy'?" in (
        capsys.readouterr().err
    )


def test_bad_input_exits_2_with_a_named_error(study, tmp_path, capsys):
    missing = cli(tmp_path / "nowhere", study)
    assert missing.returncode == 2
    assert f"BASE {tmp_path / 'nowhere'}: no such folder" in missing.stderr
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    assert compare_cli.main([str(study), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert f"NEW {tmp_path / 'empty'}: no metrics.json under this folder" in err
    (tmp_path / "x.json").write_text("{}")
    assert compare_cli.main([str(study), str(tmp_path / "x.json")]) == 2
    assert "not a scaling card" in capsys.readouterr().err
    broken = json.loads((study / "scaling-card.json").read_text())
    del broken["machine"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    assert compare_cli.main([str(tmp_path / "broken.json"), str(study)]) == 2
    assert "does not follow scaling-card.schema.yaml: <top>: 'machine' is a required" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as one:  # one folder without --reference: argparse's error
        compare_cli.main([str(study)])
    assert one.value.code == 2


def test_compare_with_adds_a_section_to_the_report(study, tmp_path):
    """The study (NEW) against a copy whose 2-worker runs were 2× faster (BASE)."""
    base = copy_of(study, tmp_path / "base")
    doctor(base, DDP2, 0.5)
    work = study.parent.parent
    cfg = work / "cfg-compare.yaml"
    cfg.write_text(yaml.safe_dump({**STUDY, "compare_with": str(base)}))
    p = snakemake(work, "--cores", "1", "--configfile", str(cfg))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    page = (study / "report.html").read_text()
    section = page[page.index('id="compared"') : page.index('id="environment"')]
    assert "slower" in section and "torch-ddp seed-small digits N=2" in section


def test_with_prices_a_dearer_cell_is_reported_like_a_slowdown(study, tmp_path):
    """Same throughput, twice the threads per worker (a cpu-core price is per thread): the
    2-worker cell costs twice as much per million samples and fails the check; a device no
    price names is not comparable, and says why."""
    dear = copy_of(study, tmp_path / "dear")
    for f in dear.glob(f"runs/{DDP2}"):
        rec = json.loads(f.read_text())
        rec["spec"]["threads_per_worker"] *= 2
        f.write_text(json.dumps(rec))
    prices = tmp_path / "cost.yaml"
    prices.write_text(yaml.safe_dump({"cost": {"device_hour": {"cpu-core": 0.04}}}))
    p = cli(study, dear, "--cost", prices, "--json", tmp_path / "c.json")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "dearer: torch-ddp seed-small digits N=2" in p.stdout
    result = json.loads((tmp_path / "c.json").read_text())
    assert verdicts(result) == {1: "same", 2: "same"}  # throughput did not change
    costs = {r["cell"]["workers"]: r for r in result["cells"]}
    assert costs[2]["cost_verdict"] == "dearer" and costs[1]["cost_verdict"] == "same"
    assert costs[2]["cost_ratio"] == pytest.approx(2.0) and costs[2]["cost_ci_low"] > 1.05
    assert cli(study, dear).returncode == 0  # without prices: no cost verdict
    prices.write_text(yaml.safe_dump({"cost": {"device_hour": {"H100": 2.49}}}))
    p = cli(study, study, "--cost", prices)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "not comparable, no price in BASE: cost.device_hour has no 'cpu-core' price" in p.stdout

"""The one command for users, `trainscale`, and the old `python -m` ways in that scripts use."""

import re
import subprocess

import pytest

from conftest import PYTHON, ROOT, run_env

COMMANDS = (
    "check", "report", "compare", "card", "collectives", "export-data", "gpu-check", "doctor",
)  # fmt: skip


def trainscale(*args: str, module: str = "trainscale") -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", module, *args], cwd=ROOT, env=run_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def test_trainscale_alone_lists_every_subcommand():
    p = trainscale()
    assert p.returncode == 0, p.stderr
    for name in COMMANDS:
        assert f"\n    {name}" in p.stdout, name


@pytest.mark.parametrize("name", COMMANDS)
def test_every_subcommand_has_its_own_help(name):
    p = trainscale(name, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: trainscale {name}")
    lines = p.stdout.splitlines()
    options = [i for i, ln in enumerate(lines) if ln.startswith("  -")]
    assert options
    for i in options:  # argparse puts an option's help beside it, or under it when it is long
        beside = re.search(r"\S {2,}\S", lines[i].strip())
        under = i + 1 < len(lines) and re.match(r" {8,}[^ -]", lines[i + 1])
        assert beside or under, f"{name}: {lines[i].strip()} has no help line"


def test_check_is_the_one_way_in():
    p = trainscale("check", ".test/config.yaml")
    assert p.returncode == 0, p.stderr
    assert "study 'ci-torch': 3 runs" in p.stdout + p.stderr
    gone = trainscale(".test/config.yaml", module="trainscale.matrix")  # the old way, removed
    assert gone.returncode == 1 and "No module named trainscale.matrix" in gone.stderr


def test_check_fails_on_a_bad_study_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: x\nmatrix: {strategy: [torch], model: [seed-smal], dataset: [digits]}\n")
    p = trainscale("check", str(bad))
    assert p.returncode == 1
    assert "matrix.model[0]: 'seed-smal' is not one of" in p.stderr


def test_an_unknown_command_is_refused():
    p = trainscale("bogus")
    assert p.returncode == 2 and "invalid choice: 'bogus'" in p.stderr
    p = trainscale("--bogus")
    assert p.returncode == 2 and "unrecognized arguments: --bogus" in p.stderr


def test_report_and_compare_still_run_as_modules(tmp_path):
    for module in ("trainscale.report", "trainscale.compare"):
        p = trainscale("--help", module=module)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"usage: python -m {module}")
    p = trainscale("--runs-dir", str(tmp_path), "--out", str(tmp_path / "o"),
                   module="trainscale.report")  # fmt: skip
    assert p.returncode == 2 and "no metrics.json under" in p.stderr

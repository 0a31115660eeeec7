"""tests/gpu_guard.py: where GPU tests must run (a node with CUDA, or --require-gpu), a GPU
path whose test was skipped, deselected or never written fails the session. Checked here on
CPU by running small pytest sessions of their own with `--require-gpu`, and on the tally."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainscale.gpu import check as gpu_check

from conftest import ROOT, run_env
from gpu_guard import Tally, problems

PATHS = gpu_check.names()


def session(tmp_path, body: str, *args: str) -> subprocess.CompletedProcess:
    """A pytest session of its own over one test file, with the guard loaded as a plugin."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_paths.py").write_text(f"import pytest\nPATHS = {PATHS!r}\n{body}")
    env = run_env(PYTHONPATH=f"{ROOT / 'tests'}:{ROOT / 'workflow'}")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "gpu_guard", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def guarded_tests(paths_expr: str, outcome: str) -> str:
    return (
        "@pytest.mark.parametrize('p', [pytest.param(n, marks=pytest.mark.gpu(path=n)) "
        f"for n in {paths_expr}])\ndef test_path(p):\n    {outcome}\n"
    )


def test_skipped_gpu_tests_pass_on_cpu_and_fail_where_required(tmp_path):
    body = guarded_tests("PATHS", "pytest.skip('no CUDA device')")
    cpu = session(tmp_path, body)
    assert cpu.returncode == 0, cpu.stdout
    assert f"gpu tests: 0 ran, {len(PATHS)} skipped" in cpu.stdout
    required = session(tmp_path, body, "--require-gpu")
    assert required.returncode == 1, required.stdout
    assert "test_path[torch-cuda-fp32] was skipped where GPU tests must run: no CUDA device" in (
        required.stdout
    )


def test_a_path_without_a_test_fails_where_required(tmp_path):
    body = guarded_tests("[n for n in PATHS if n != 'cuda-oom']", "pass")
    p = session(tmp_path, body, "--require-gpu")
    assert p.returncode == 1, p.stdout
    assert f"gpu tests: {len(PATHS) - 1} ran, 0 skipped" in p.stdout
    assert "no gpu test for the GPU path 'cuda-oom'" in p.stdout
    every = session(tmp_path, guarded_tests("PATHS", "pass"), "--require-gpu")
    assert every.returncode == 0, every.stdout
    assert f"gpu tests: {len(PATHS)} ran, 0 skipped" in every.stdout


def test_deselecting_gpu_tests_fails_where_required(tmp_path):
    p = session(tmp_path, guarded_tests("PATHS", "pass"), "--require-gpu", "-m", "not gpu")
    assert p.returncode == 1, p.stdout
    assert f"gpu tests: 0 ran, 0 skipped, {len(PATHS)} deselected" in p.stdout
    assert "was deselected where GPU tests must run" in p.stdout


def test_an_optional_path_may_be_not_installed(tmp_path):
    body = guarded_tests(
        "PATHS",
        "if p == 'tensorflow-gpu': pytest.skip('not installed: a GPU build of TensorFlow')",
    )
    p = session(tmp_path, body, "--require-gpu")
    assert p.returncode == 0, p.stdout
    body = guarded_tests("PATHS", "if p == 'cuda-oom': pytest.skip('not installed: x')")
    assert session(tmp_path, body, "--require-gpu").returncode == 1  # not an optional path


def test_a_failed_gpu_test_counts_as_ran():
    t = Tally(paths={"a": "x", "b": "y"}, outcome={"a": "ran", "b": "ran"})
    assert problems(t, ["x", "y"], frozenset(), whole_suite=True) == []
    assert t.line() == "gpu tests: 2 ran, 0 skipped"


@pytest.mark.parametrize("whole_suite", [True, False])
def test_no_gpu_test_collected(whole_suite):
    """The whole suite without the GPU tests fails; one file without them is fine."""
    found = problems(Tally(), ["x"], frozenset(), whole_suite)
    assert found == (["no gpu test for the GPU path 'x'"] if whole_suite else [])


def test_the_guard_judges_the_reports_of_xdist_workers(tmp_path):
    """`make test` runs the suite in pytest-xdist workers: the session that judges sees their
    reports, not the items."""
    skipped = session(
        tmp_path,
        guarded_tests("PATHS", "pytest.skip('no CUDA device')"),
        "-n",
        "2",
        "--require-gpu",
    )
    assert skipped.returncode == 1, skipped.stdout
    assert f"gpu tests: 0 ran, {len(PATHS)} skipped" in skipped.stdout
    assert "test_path[cuda-oom] was skipped where GPU tests must run: no CUDA device" in (
        skipped.stdout
    )
    ran = session(tmp_path, guarded_tests("PATHS", "pass"), "-n", "2", "--require-gpu")
    assert ran.returncode == 0, ran.stdout
    assert f"gpu tests: {len(PATHS)} ran, 0 skipped" in ran.stdout

"""Shared test helpers: the repo root, a validated config, and a way to run a worker for real."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
PYTHON = sys.executable
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
#: a SLURM configuration whose controller refuses at once (see the file): every Snakemake start
#: runs `scontrol show config` (snakemake-executor-plugin-slurm, at import), which waits ~9 s
#: wherever a configured controller does not answer. Only tests/test_slurm.py's `cluster`
#: fixture needs a real controller: it lifts this while the local cluster is up.
OFFLINE_SLURM_CONF = ROOT / "scripts" / "slurm-offline.conf"
os.environ["SLURM_CONF"] = str(OFFLINE_SLURM_CONF)


def validated(cfg: dict) -> dict:
    """Validate and fill defaults exactly as the Snakefile does (snakemake.utils.validate)."""
    from snakemake.utils import validate

    cfg = copy.deepcopy(cfg)
    validate(cfg, str(SCHEMA))
    return cfg


def base_config(**matrix) -> dict:
    m = {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]}
    m.update(matrix)
    return validated({"study": "t", "matrix": m})


def run_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "workflow"), env.get("PYTHONPATH")])
    )
    env.update(extra)
    return env


def launch(spec, out: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """Run one spec through the real supervisor (python -m trainscale.launch); past `timeout`
    the supervisor is sent SIGTERM, which stops the run's process group too."""
    p = subprocess.Popen(
        [PYTHON, "-m", "trainscale.launch", "--spec", spec.to_json(), "--out", str(out)],
        cwd=ROOT,
        env=run_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        stdout, stderr = p.communicate(timeout=30)
        raise subprocess.TimeoutExpired(p.args, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)


def launch_losing_a_worker(spec, tmp_path: Path, when: str) -> tuple[Path, str]:
    """Run an elastic Horovod spec of 2 workers through the real supervisor with a hosts file
    of 2 slots (TRAINSCALE_HOROVOD_HOSTS, read by its discovery script), and cut the file to
    1 slot as soon as the output shows `when`. Returns (metrics path, the whole output) once
    the run exited 0; a run past 300 s or failing fails the test with its last lines."""
    import time

    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    out = tmp_path / "metrics.json"
    proc = subprocess.Popen(
        [PYTHON, "-m", "trainscale.launch", "--spec", spec.to_json(), "--out", str(out)],
        cwd=ROOT,
        env=run_env(TRAINSCALE_HOROVOD_HOSTS=str(hosts)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 300
    try:
        for line in proc.stdout:
            lines.append(line)
            if when in line:
                hosts.write_text("localhost:1\n")  # take one worker away
            assert time.monotonic() < deadline, "".join(lines[-50:])
        proc.wait(timeout=60)
    finally:
        proc.kill()
    log = "".join(lines)
    assert proc.returncode == 0, log[-3000:]
    return out, log


def snakemake(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the workflow as a user would, in `workdir` (so the repo's results/ stay untouched)."""
    return subprocess.run(
        [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def root() -> Path:
    return ROOT


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# On a node with CUDA every GPU path's test must run: tests/gpu_guard.py, as this suite's hooks.
from gpu_guard import (  # noqa: E402, F401
    pytest_addoption,
    pytest_configure,
    pytest_deselected,
    pytest_itemcollected,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

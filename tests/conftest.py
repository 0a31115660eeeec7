"""Shared test helpers: the repo root, a validated config, and a way to run a worker for real."""

from __future__ import annotations

import copy
import functools
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
#: record blocks whose inner keys are what the run did, not the record's shape: the variables
#: its launcher set, the set-up's phases it had (no rendezvous in one process, Lightning's
#: inside its Trainer) and the measurements after training it ran. Key-set tests compare
#: every other key of a family's records.
NAMED_BY_THE_RUN = ("env.variables", "timeline.set_up", "timeline.parts")


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
    """The environment of a run launched by a test: the package importable, and the venv's
    bin first on PATH, as Snakemake puts its own for every job: the same tools (ninja, which
    builds DeepSpeed's op: two versions' build logs rebuild each other's) in both."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "workflow"), env.get("PYTHONPATH")])
    )
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(PYTHON).parent), env.get("PATH")]))
    env.update(extra)
    return env


def launch(spec, out: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """Run one spec through the real supervisor (python -m trainscale.launch); past `timeout`
    the supervisor is sent SIGTERM, which stops the run's process group too, and the test
    fails with the end of the run's output (where it hung)."""
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
        pytest.fail(f"the run did not end within {timeout} s (stopped); the end of its output:\n"
                    f"{stdout[-3000:]}\n--- stderr:\n{stderr[-5000:]}")  # fmt: skip
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


def snakemake(
    workdir: Path, *args: str, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the workflow as a user would, in `workdir` (so the repo's results/ stay untouched);
    `env`: the whole environment (None: this process's)."""
    return subprocess.run(
        [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture
def root() -> Path:
    return ROOT


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# Studies that tests in several files read: each runs once per session (a Snakemake study costs
# a minute or more on 2 cores). But for torch_study (the whole default target, checked by
# tests/test_workflow.py), their targets stop at the files their tests read: the figures and the
# report are built in torch_study and in the studies of test_seeds.py, test_faults.py and
# test_slurm.py (and the runs_table rule reads and checks every record on the way).


def study_records(results: Path) -> list[tuple[dict, Path]]:
    """Every metrics record under `results`/runs, validated (metrics.read), with its path."""
    from trainscale.measure import metrics

    return [(metrics.read(f), f) for f in sorted(results.glob("runs/**/metrics.json"))]


def run_test_study(
    work: Path, name: str, *files: str, env: dict[str, str] | None = None
) -> tuple[Path, subprocess.CompletedProcess]:
    """`.test/<name>.yaml` through Snakemake on 2 cores in `work`, up to `files` (paths under
    results/<study>/; none: the whole default target): its results dir and Snakemake's run.
    A study that fails fails every test that reads it, with Snakemake's last output."""
    cfg = ROOT / ".test" / f"{name}.yaml"
    study = load_yaml(cfg)["study"]
    targets = [f"results/{study}/{f}" for f in files]
    p = snakemake(work, *targets, "--cores", "2", "--configfile", str(cfg), env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return work / "results" / study, p


@pytest.fixture(scope="session")
def torch_study(tmp_path_factory) -> dict:
    """`.test/config.yaml` through Snakemake, its whole default target (runs, tables,
    predictions, figures, report): torch on 1 worker, torch-ddp on 1 and 2; with Snakemake's
    output, the record paths and the records (tests/test_workflow.py, test_aggregate.py,
    test_torch_loop.py)."""
    work = tmp_path_factory.mktemp("torch-study")
    results, p = run_test_study(work, "config")
    return {
        "workdir": work,
        "results": results,
        "files": sorted(results.glob("runs/**/metrics.json")),
        "recs": study_records(results),
        "output": p.stdout + p.stderr,
    }


def shipped_studies_cwd(work: Path) -> None:
    """`work` made a directory the shipped study files (.test/*.yaml) can be read from, as
    `make dryrun` reads them from the repository: `snakemake export_data`'s digits (read by
    .test/imagedata.yaml) and the third-party model's `code:` folder (.test/thirdparty.yaml)."""
    from trainscale.data import export_data

    export_data.export("digits", str(ROOT / "data"), work / "results" / "export" / "digits")
    link_test_models(work)


def link_test_models(work: Path) -> None:
    """.test/models (the `code:` of .test/thirdparty.yaml, relative to where Snakemake runs)
    in `work`."""
    (work / ".test").mkdir(exist_ok=True)
    (work / ".test" / "models").symlink_to(ROOT / ".test" / "models", target_is_directory=True)


def preflight_check(work: Path) -> tuple[subprocess.CompletedProcess, str]:
    """`trainscale check --no-memory study.yaml` in `work`, and the own-model pre-flight
    child's log there: where what the user's code printed, logged or warned went."""
    check = [PYTHON, "-m", "trainscale", "check", "--no-memory", "study.yaml"]
    p = subprocess.run(check, cwd=work, env=run_env(), capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    (log,) = (work / ".cache" / "trainscale" / "own-models").glob("*.log")
    return p, log.read_text()


def reuse_deepspeed_ops(work: Path) -> None:
    """The DeepSpeed op this checkout's .cache holds, copied into a study's `work` dir with its
    files' times: the deepspeed_ops rule still runs and loads it (0.1 s instead of 30-45 s on 2
    cores), as a user's second study would. The op is compiled there once per session first
    (deepspeed_ops_built): a copy of an absent or half-written build is compiled again."""
    import shutil

    shutil.copytree(
        deepspeed_ops_built(),
        work / ".cache" / "torch_extensions",
        ignore=shutil.ignore_patterns("deepspeed-ops.done", "*.lock"),
        dirs_exist_ok=True,
    )


@functools.cache
def deepspeed_ops_built() -> Path:
    """This checkout's .cache/torch_extensions with the op built, as the deepspeed_ops rule
    builds it (a no-op of ~3 s where it is built already)."""
    built = ROOT / ".cache" / "torch_extensions"
    cmd = [PYTHON, "-m", "trainscale.runners.torch.deepspeed_zero", "--build-ops"]
    p = subprocess.run(cmd, cwd=ROOT, env=run_env(TORCH_EXTENSIONS_DIR=str(built)),
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return built


@pytest.fixture(scope="session")
def deepspeed_study(tmp_path_factory) -> dict:
    """`.test/deepspeed.yaml` through Snakemake up to runs.csv: ZeRO 0-3 at fp32, ZeRO-1 at
    bf16, with the test plug-in (tests/tap_plugin): "taps", each record's path to what its run
    wrote (tap.of_run; the runs took turns, checked).

    The op the DeepSpeed tests' runs compiled in this checkout's .cache (47 s on 2 cores) is
    reused, as a user's second study would: the deepspeed_ops rule still runs and loads it."""
    from itertools import pairwise

    import tap

    work = tmp_path_factory.mktemp("deepspeed-study")
    reuse_deepspeed_ops(work)
    env = run_env(**tap.env(work / "tap"))
    results, _ = run_test_study(work, "deepspeed", "runs.csv", env=env)
    recs = study_records(results)
    spans = sorted((r["timeline"]["launched_unix"], r["timeline"]["exited_unix"]) for r, _ in recs)
    assert all(a[1] < b[0] for a, b in pairwise(spans)), f"runs overlapped: {spans}"
    taps = {f: tap.of_run(work / "tap", r, work / "taps" / str(i))
            for i, (r, f) in enumerate(recs)}  # fmt: skip
    return {"workdir": work, "results": results, "recs": recs, "taps": taps}


@pytest.fixture(scope="session")
def parallel_study(tmp_path_factory) -> dict:
    """`.test/parallel.yaml` through Snakemake: torch-fsdp and torch-pipeline beside torch-ddp
    on 2 CPU workers, up to communication.csv and the bus-bandwidth figure (the all-reduce
    benchmark for 2 workers and the communication model)."""
    work = tmp_path_factory.mktemp("parallel-study")
    results, _ = run_test_study(work, "parallel", "communication.csv", "figures/busbw.png")
    return {"workdir": work, "results": results, "recs": study_records(results)}


@pytest.fixture(scope="session")
def tf_study(tmp_path_factory) -> dict[str, dict]:
    """`.test/tf.yaml` through Snakemake, for real, up to the tables tests/test_tf.py reads
    (runs.csv, summary.txt), with the test plug-in (tests/tap_plugin): metrics records by
    strategy, and "_dir" (results, workdir, Snakemake's output and the plug-in's files)."""
    import tap

    workdir = tmp_path_factory.mktemp("tf-study")
    taps = workdir / "tap"
    env = run_env(**tap.env(taps))
    results, p = run_test_study(workdir, "tf", "runs.csv", "summary.txt", env=env)
    recs = {rec["spec"]["strategy"]: rec for rec, _ in study_records(results)}
    output = p.stdout + p.stderr
    recs["_dir"] = {"results": results, "workdir": workdir, "output": output, "tap": taps}
    return recs


@pytest.fixture(scope="session")
def horovod_study(tmp_path_factory) -> dict:
    """`.test/horovod.yaml` through Snakemake up to runs.csv, with the test plug-in
    (tests/tap_plugin): records by strategy, every rank's final weights (PyTorch runners in
    the tap, horovod-keras in `weights`)."""
    import tap

    workdir = tmp_path_factory.mktemp("horovod-study")
    weights = workdir / "weights"
    weights.mkdir()
    save = str(weights / "{strategy}-{rank}")  # horovod-keras saves each rank's weights here
    env = run_env(TRAINSCALE_SAVE_WEIGHTS=save, **tap.env(workdir / "tap"))
    results, _ = run_test_study(workdir, "horovod", "runs.csv", env=env)
    recs = {rec["spec"]["strategy"]: (rec, f) for rec, f in study_records(results)}
    return {"recs": recs, "weights": weights, "workdir": workdir, "tap": workdir / "tap"}


#: epochs of the horovod-keras-elastic runs at a fixed size: nothing changes, so 2 show the
#: steady state
ELASTIC_KERAS_EPOCHS = 2


def elastic_keras_spec(workers: int, epochs: int):
    """horovod-keras-elastic, seed-small on digits, scale 4 (89 steps of the global batch of 64
    per epoch)."""
    from trainscale.plan.matrix import build_runs

    m = {"strategy": ["horovod-keras-elastic"], "model": ["seed-small"], "dataset": ["digits"]}
    m |= {"workers": [workers], "batch_size": [64], "scale": [4]}
    return build_runs(validated({"study": "t", "epochs": epochs, "matrix": m}))[0][0]


@pytest.fixture(scope="session")
def elastic_keras_runs(tmp_path_factory) -> dict[int, tuple[dict, Path]]:
    """horovod-keras-elastic runs that keep their 1 and 2 workers throughout, with the test
    plug-in (tests/tap_plugin): (record, the plug-in's files) by worker count."""
    from trainscale.measure import metrics

    import tap

    runs = {}
    for workers in (1, 2):
        work = tmp_path_factory.mktemp(f"elastic-keras-{workers}")
        out, taps = work / "metrics.json", work / "tap"
        spec = elastic_keras_spec(workers, ELASTIC_KERAS_EPOCHS)
        p = launch(spec, out, timeout=300, **tap.env(taps))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        runs[workers] = metrics.read(out), taps  # validated against the metrics schema
    return runs


@pytest.fixture(scope="session")
def elastic_keras_fixed(elastic_keras_runs) -> dict[int, dict]:
    """The records of elastic_keras_runs by worker count (tests/test_horovod_keras_elastic.py,
    and the Keras family's in tests/test_keras_loop.py)."""
    return {workers: rec for workers, (rec, _) in elastic_keras_runs.items()}


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

# One group per study under pytest-xdist: tests/xdist_groups.py, as this suite's hook.
from xdist_groups import pytest_collection_modifyitems, pytest_runtest_call  # noqa: E402, F401

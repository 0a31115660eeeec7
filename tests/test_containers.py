"""Config `container`, `env` and `slurm` (issue 60), as pure functions: the launch lines that
enter an image (apptainer around each process on a node, pyxis through srun), the variables
every rank gets, what each job asks of SLURM, the cells they rule out, the record's and the
report's environment. tests/test_slurm_containers.py runs them through Snakemake on SLURM."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import yaml

from trainscale.launch import commands, container, slurm
from trainscale.launch.supervise import Environment, command
from trainscale.measure import metrics, variables
from trainscale.plan import check, cluster
from trainscale.plan.matrix import ConfigError, build_runs

from conftest import base_config, validated

APPTAINER = container.Container("/img/ts.sif", "apptainer", ("/data",), "/w", "/repo/workflow")
PYXIS = container.Container("nvcr.io#nvidia/pytorch:25.01-py3", "pyxis", (), "/w", "/repo/wf")
VARS = (("NCCL_IB_HCA", "mlx5"), ("NCCL_SOCKET_IFNAME", "ib0"))


def spec(strategy="torch-ddp", **m):
    runs, _ = build_runs(base_config(strategy=[strategy], **m), accelerator="cuda")
    return runs[0]


def slurm_env(nodes: int, image: container.Container | None, **kw) -> Environment:
    names = tuple(f"n{i}" for i in range(1, nodes + 1))
    return Environment(
        mode="slurm", python="/venv/bin/python", nodes=names, port=29500, job_id="7",
        container=image, variables=VARS, **kw,
    )  # fmt: skip


def test_apptainer_wraps_the_one_node_launcher_and_sets_the_variables_inside():
    s = spec("torch-ddp", workers=[2])
    argv = command(s, slurm_env(1, APPTAINER), "m.json")
    binds = ["/w:/w", "/repo/workflow:/repo/workflow", "/data:/data"]
    entry = ["apptainer", "exec", "--nv", *(a for b in binds for a in ("--bind", b)),
             "--pwd", "/w", "/img/ts.sif"]  # fmt: skip
    assert argv[: len(entry)] == entry
    rest = argv[len(entry) :]
    i = rest.index("python")  # the image's interpreter, not the submitting venv's
    assert rest[:i] == ["env", "PYTHONPATH=/repo/workflow", "MKL_NUM_THREADS=1",
                        "NCCL_IB_HCA=mlx5", "NCCL_SOCKET_IFNAME=ib0", "OMP_NUM_THREADS=1",
                        "OPENBLAS_NUM_THREADS=1"]  # fmt: skip
    assert rest[i + 1 : i + 3] == ["-m", "torch.distributed.run"]
    assert "/venv/bin/python" not in argv


def test_apptainer_across_nodes_keeps_srun_outside_and_enters_the_image_per_task():
    s = spec("torch-ddp", workers=[1], nodes=[2])
    argv = command(s, slurm_env(2, APPTAINER), "m.json")
    srun = commands.srun(s, 1)  # with each task's CPUs and, one worker a node, its GPU
    assert srun[-4:] == ["--cpus-per-task=1", "--gpus-per-task=1", "--gpu-bind=per_task:1",
                         "--kill-on-bad-exit=1"]  # fmt: skip
    assert argv[: len(srun)] == srun
    assert argv[len(srun) : len(srun) + 3] == ["apptainer", "exec", "--nv"]
    tf = spec("tf-multiworker", workers=[1], nodes=[2])
    line = command(tf, slurm_env(2, APPTAINER), "m.json")
    image = line.index("/img/ts.sif")
    assert line[0] == "srun" and line.index("apptainer") < image < line.index(
        "TF_USE_LEGACY_KERAS=1"
    )
    assert "TRAINSCALE_TF_CLUSTER=slurm" in line[image:] and "python" in line[image:]


def test_pyxis_enters_the_image_through_srun_on_one_node_and_across_nodes():
    one = spec("torch-ddp", workers=[2])
    argv = command(one, slurm_env(1, PYXIS), "m.json")
    assert argv[:6] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--cpus-per-task=2",
                        "--kill-on-bad-exit=1"]  # fmt: skip
    assert argv[6:9] == [
        "--container-image=nvcr.io#nvidia/pytorch:25.01-py3",
        "--container-mounts=/w:/w,/repo/wf:/repo/wf",
        "--container-workdir=/w",
    ]
    assert argv[9] == "env" and "apptainer" not in argv
    two = spec("torch-ddp", workers=[1], nodes=[2])
    argv = command(two, slurm_env(2, PYXIS), "m.json")
    srun = commands.srun(two, 1)
    assert argv[: len(srun)] == srun and argv[len(srun)].startswith("--container-image=")
    probe = commands.probe_command(two, slurm_env(2, PYXIS))
    assert probe[: len(srun)] == srun and probe[-2:] == ["-m", "trainscale.launch.devices"]


def test_without_a_container_the_line_is_as_before_with_the_variables_in_front():
    s = spec("torch-ddp", workers=[2])
    plain = command(s, Environment(mode="local", python="/venv/bin/python"), "m.json")
    given = command(
        s, Environment(mode="local", python="/venv/bin/python", variables=VARS), "m.json"
    )
    assert given == [plain[0], plain[1], *(f"{k}={v}" for k, v in VARS), *plain[2:]]


def test_deepspeeds_op_build_enters_the_image_once(monkeypatch):
    """The deepspeed_ops job compiles against the image's torch: it starts itself again
    inside the image, marked so that it does not enter twice; without a container it stays."""
    started = []
    monkeypatch.setattr(os, "execvp", lambda f, argv: started.append(argv))
    environ = container.to_environ({"image": "/img/ts.sif"}, {})
    container.reenter("trainscale.runners.torch.deepspeed_zero", ["--build-ops"], environ)
    (argv,) = started
    assert argv[:3] == ["apptainer", "exec", "--nv"] and "/img/ts.sif" in argv
    i = argv.index("/img/ts.sif")
    assert argv[i + 1 : i + 3] == ["env", "TRAINSCALE_IN_IMAGE=1"]
    assert argv[-4:] == ["python", "-m", "trainscale.runners.torch.deepspeed_zero", "--build-ops"]
    container.reenter("m", [], {**environ, "TRAINSCALE_IN_IMAGE": "1"})
    container.reenter("m", [], {})
    assert len(started) == 1


def test_the_job_environment_carries_both_settings_to_the_launcher():
    environ = container.to_environ(
        {"image": "/img/ts.sif", "mounts": ["/data"]}, {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": 1}
    )
    assert environ["NCCL_DEBUG"] == "INFO" and environ["NCCL_IB_DISABLE"] == "1"
    env = slurm.detect({**environ, "SLURM_JOB_ID": "9"})
    assert env.container.image == "/img/ts.sif" and env.container.runtime == "apptainer"
    assert env.container.workdir == os.getcwd() and env.container.package == slurm.PACKAGE_DIR
    assert env.variables == (("NCCL_DEBUG", "INFO"), ("NCCL_IB_DISABLE", "1"))
    assert slurm.detect({}).container is None and slurm.detect({}).variables == ()


def test_slurm_options_ask_for_exclusive_nodes_their_gpus_and_features():
    s = spec("torch-ddp", workers=[4])
    plain = slurm.slurm_resources(s, "cuda")
    opts = {"exclusive": True, "gpus_per_node": 8, "constraint": "h100&ib"}
    res = slurm.slurm_resources(s, "cuda", options=opts)
    assert res == {**plain, "gres": "gpu:8", "slurm_extra": "--exclusive", "constraint": "h100&ib"}
    tf = spec("tf-multiworker", workers=[2], nodes=[2])
    extra = slurm.slurm_resources(tf, "cpu", options=opts)["slurm_extra"]
    assert extra == "--ntasks-per-node=2 --exclusive"
    assert "gres" not in slurm.slurm_resources(tf, "cpu", options=opts)  # no GPUs asked on CPU
    assert slurm.slurm_resources(s, "cuda", options={}) == plain
    assert set(res) <= set(slurm.SLURM_RESOURCE_KEYS)


def test_cells_the_cluster_options_rule_out_are_dropped_with_the_reason():
    cfg = base_config(strategy=["torch-ddp", "horovod-torch"], workers=[4, 8], nodes=[1, 2])
    cfg.update(slurm={"gpus_per_node": 4}, container={"image": "x.sif"})
    runs, dropped = build_runs(cfg, "cuda")
    assert {(r.strategy, r.workers, r.nodes) for r in runs} == {
        ("torch-ddp", 4, 1), ("torch-ddp", 4, 2), ("horovod-torch", 4, 1)}  # fmt: skip
    reasons = {(d.values["strategy"], d.values["workers"], d.values["nodes"]): d.reason
               for d in dropped}  # fmt: skip
    assert "slurm.gpus_per_node is 4" in reasons[("torch-ddp", 8, 1)]
    assert "across nodes Horovod's workers start outside the" in reasons[("horovod-torch", 4, 2)]
    assert build_runs({**cfg, "container": None}, "cpu")[0]  # CPU: no GPUs to count


def test_bad_settings_are_refused_naming_the_key(tmp_path):
    cases = {
        "env.OMP_NUM_THREADS: trainscale sets OMP_NUM_THREADS": {"env": {"OMP_NUM_THREADS": 4}},
        "env.CUDA_VISIBLE_DEVICES": {"env": {"CUDA_VISIBLE_DEVICES": "0"}},
        "container.runtime: 'docker' is not one of apptainer, pyxis": {
            "container": {"image": "x", "runtime": "docker"}
        },
        "container: 'image' is a required property": {"container": {"runtime": "pyxis"}},
        "slurm.gpu_per_node: unknown key; did you mean 'gpus_per_node'?": {
            "slurm": {"gpu_per_node": 8}
        },
        "env: '1BAD' has characters not allowed": {"env": {"1BAD": "x"}},
    }
    m = {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]}
    for needle, extra in cases.items():
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump({"study": "bad", "matrix": m, **extra}))
        problems = check.check_file(path, show_memory=False)
        assert any(needle in p for p in problems), (needle, problems)


def test_a_local_study_needs_apptainer_here_and_cannot_use_pyxis():
    assert cluster.local_problems(None) == []
    pyxis = cluster.local_problems({"image": "x", "runtime": "pyxis"})
    assert "needs a SLURM cluster with the pyxis plugin" in pyxis[0]
    none = cluster.local_problems({"image": "x"}, which=lambda _: None)
    assert "no `apptainer` on PATH" in none[0]
    assert cluster.local_problems({"image": "x"}, which=lambda _: "/b/a") == []


def test_digest_is_the_pinned_one_or_the_files_hashed_once(tmp_path):
    pinned = "docker://nvcr.io/nvidia/pytorch@sha256:" + "ab" * 32
    assert container.digest(pinned) == "sha256:" + "ab" * 32
    assert container.digest("docker://pytorch/pytorch:latest") is None
    sif = tmp_path / "ts.sif"
    sif.write_bytes(b"SIF image bytes")
    want = "sha256:" + hashlib.sha256(b"SIF image bytes").hexdigest()
    assert container.digest(str(sif), tmp_path / "cache") == want
    cached = json.loads((tmp_path / "cache" / "container-digests.json").read_text())
    assert list(cached.values()) == [want]
    c = container.Container(str(sif), "apptainer")
    described = container.describe(c, tmp_path / "cache")
    assert described == {"image": str(sif), "digest": want, "runtime": "apptainer"}
    assert container.describe(None) is None


def test_the_record_lists_the_variables_the_ranks_saw_and_validates():
    environ = {"NCCL_DEBUG": "INFO", "CUDA_HOME": "/cuda", "OMP_NUM_THREADS": "2",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "HOROVOD_FUSION_THRESHOLD": "0",
               "MY_FLAG": "on", "HOME": "/root"}  # fmt: skip
    environ["TRAINSCALE_ENV"] = json.dumps({"MY_FLAG": "on"})  # config env's names
    seen = variables.seen(environ)
    assert list(seen) == ["CUDA_HOME", "HOROVOD_FUSION_THRESHOLD", "MY_FLAG", "NCCL_DEBUG",
                          "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]  # fmt: skip
    assert variables.nccl_version() is None  # the CPU wheel has no NCCL
    s = spec("torch")
    rec = metrics.empty_record(s.to_dict(), "failed", "x")
    assert set(rec["env"]) >= {"variables", "nccl", "container"}
    rec["env"]["container"] = {"image": "x.sif", "digest": None, "runtime": "apptainer"}
    rec["env"]["variables"] = seen
    metrics.validate(rec)
    rec["env"]["container"]["runtime"] = "docker"
    with pytest.raises(metrics.MetricsError):
        metrics.validate(rec)


def test_the_settings_stay_out_of_the_run_spec():
    """Changing them re-runs nothing: the spec (the train rule's params) is the same."""
    m = {"strategy": ["torch-ddp"], "model": ["seed-small"], "dataset": ["digits"]}
    plain = build_runs(validated({"study": "t", "matrix": m}))[0]
    cfg = {"study": "t", "matrix": m, "env": {"NCCL_DEBUG": "INFO"},
           "container": {"image": "x.sif", "runtime": "pyxis"},
           "slurm": {"exclusive": True}}  # fmt: skip
    assert [r.to_json() for r in build_runs(validated(cfg))[0]] == [r.to_json() for r in plain]
    with pytest.raises(ConfigError, match="matrix is empty"):
        build_runs(validated({**cfg, "slurm": {"gpus_per_node": 1}, "accelerator": "cuda",
                              "matrix": {**m, "workers": [2]}}), "cuda")  # fmt: skip


def test_the_reports_environment_section_shows_the_container_nccl_and_variables():
    from trainscale.analysis.metrics_tables import runs_frame
    from trainscale.analysis.study import Study
    from trainscale.report import rows

    recs = []
    for i, image in enumerate(({"image": "ts.sif", "digest": "sha256:ab", "runtime": "apptainer"},
                               None)):  # fmt: skip
        rec = metrics.empty_record(spec("torch").to_dict(), "failed", "x")
        rec["env"].update(container=image, nccl={"version": "2.21.5", "transport": "NET/IB"})
        rec["env"]["variables"] = {"NCCL_IB_HCA": "mlx5", "OMP_NUM_THREADS": "1"}
        rec["run"] = f"r{i}"
        recs.append(rec)
    shown = dict(rows.environment(Study(name="s", runs=runs_frame(recs))))
    assert shown["container"] == "apptainer · ts.sif · sha256:ab (1 run); none (1 run)"
    assert shown["NCCL"] == "2.21.5" and shown["NCCL transport"] == "NET/IB"
    assert shown["NCCL_IB_HCA"] == "mlx5" and shown["OMP_NUM_THREADS"] == "1"

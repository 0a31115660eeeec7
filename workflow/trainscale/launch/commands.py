"""Command lines: a run spec and the machine it lands on -> the exact command that runs it.

`command(spec, env)` is a pure function from a run spec and the machine it lands on (local or
a SLURM allocation, with or without a container) to the exact command line, built by the
strategy's launcher form (its catalog row's `launcher`): one process, torchrun, tfrun or
horovodrun, entering the image where config `container` names one (launch.container). It is
unit-tested for every strategy and every form, including GPU and multi-node ones this machine
cannot run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainscale.launch import container as images
from trainscale.plan import catalog
from trainscale.plan.runspec import RunSpec


@dataclass(frozen=True)
class Environment:
    """Where a run is launched: this host alone, or a SLURM allocation of `nodes`."""

    mode: str  # "local" or "slurm"
    python: str = "python"
    nodes: tuple[str, ...] = ()  # SLURM host names, first = rendezvous host
    port: int = 0  # rendezvous port; 0 = the OS picks a free one (single node only)
    job_id: str | None = None
    cache_dir: str = ".cache"  # persistent build caches (DeepSpeed's JIT-compiled ops)
    addrs: tuple[str, ...] = ()  # SLURM NodeAddr of each node (how other nodes reach it)
    time_limit: float | None = None  # the SLURM job's time limit, seconds
    time_left: float | None = None  # seconds until it, when the run starts
    restarts: int | None = None  # times SLURM requeued the job before this start
    container: images.Container | None = None  # config `container`: the image runs enter
    variables: tuple[tuple[str, str], ...] = ()  # config `env`: set for every rank

    @property
    def head(self) -> str:
        """Rendezvous host: the first node's SLURM NodeAddr, else its name, else loopback."""
        return (self.addrs or self.nodes or ("127.0.0.1",))[0]


def worker_env(spec: RunSpec, env: Environment | None = None) -> dict[str, str]:
    """Environment every worker process gets: its thread budget (a worker is a fixed unit),
    and for DeepSpeed a persistent cache for the ops it JIT-compiles (built once, not per run).
    A compiled CPU worker compiles with its own threads too: Inductor's default, one compile
    process per core of the machine, started in every rank, would take the other workers'
    cores (config `env` may set TORCHINDUCTOR_COMPILE_THREADS otherwise)."""
    n = str(spec.threads_per_worker)
    out = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
    given = dict(env.variables if env else ())
    if spec.compile and spec.accelerator == "cpu" and COMPILE_THREADS not in given:
        out[COMPILE_THREADS] = n
    if spec.framework == "deepspeed":
        cache = env.cache_dir if env else ".cache"
        out["TORCH_EXTENSIONS_DIR"] = f"{cache}/torch_extensions"
    if catalog.STRATEGIES[spec.strategy].runtime == "tensorflow":
        out.update(TF_ENV)
    return out


def single_process(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """One process (it may drive several GPUs itself, as nn.DataParallel does)."""
    return [env.python, *worker]


def srun(spec: RunSpec, tasks_per_node: int) -> list[str]:
    """srun across the run's nodes; one failing task ends the step (no rank waits forever).
    Where the run has fewer processes than nodes × tasks_per_node (tf-ps: workers, servers and
    a chief, not a multiple of the nodes), `--ntasks-per-node` is the most on one node.

    Each task asks for its CPUs (`--cpus-per-task`, as the job asked: slurm.slurm_request):
    since SLURM 22.05 srun no longer reads SLURM_CPUS_PER_TASK, and a step asking for one CPU
    a task is confined to one under task/cgroup or task/affinity, its workers sharing it.
    Where each task is one worker on a GPU of its own, it asks for that GPU, bound to it."""
    tasks = min(spec.nodes * tasks_per_node, spec.processes)
    line = [
        "srun",
        f"--nodes={spec.nodes}",
        f"--ntasks={tasks}",
        f"--ntasks-per-node={tasks_per_node}",
        f"--cpus-per-task={task_cpus(spec, tasks)}",
        "--kill-on-bad-exit=1",
    ]
    one_gpu_each = tasks_per_node == spec.workers and spec.processes == spec.world_size
    if spec.accelerator == "cuda" and one_gpu_each:
        line[-1:-1] = ["--gpus-per-task=1", "--gpu-bind=per_task:1"]
    return line


def task_cpus(spec: RunSpec, tasks: int) -> int:
    """CPUs one of a run's `tasks` SLURM tasks needs: its share of the processes, each
    threads_per_worker threads plus its data-loader workers (as slurm.slurm_request asks)."""
    return (spec.threads_per_worker + spec.loader_workers) * -(-spec.processes // tasks)


def torchrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """torchrun with a c10d rendezvous; across SLURM nodes, srun starts one torchrun per node.

    Locally the endpoint's port is 0: the rendezvous store binds a port the OS picks, so
    several runs on one host never clash. Across nodes the supervisor picks a free port on
    the first node (where the batch script runs) and every node's torchrun dials it.
    """
    rdzv_id = f"{spec.study}-{hashlib.sha1(spec.path.encode()).hexdigest()[:12]}"
    if env.job_id:
        rdzv_id = f"slurm-{env.job_id}"
    # one node (inside SLURM too): the local form, whatever the allocation's node name is
    endpoint = f"{env.head}:{env.port}" if spec.nodes > 1 else "127.0.0.1:0"
    cmd = [
        env.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.workers}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        "--max-restarts=0",
        *worker,
    ]
    if spec.nodes == 1:
        return cmd
    if env.mode != "slurm":
        raise ValueError(
            f"{spec.strategy} with nodes={spec.nodes} needs a SLURM allocation of that many"
        )
    return [*srun(spec, tasks_per_node=1), *cmd]


#: What every TensorFlow worker needs: tf-keras 2 as tf.keras for every TF strategy (Keras 3's
#: fit fails under MultiWorkerMirroredStrategy), and TensorFlow's C++ INFO lines silenced.
TF_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}
#: Inductor's compile processes per rank (torch._inductor.config.decide_compile_threads)
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


def tfrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """tf-multiworker: one process per worker, MultiWorkerMirroredStrategy between them;
    tf-ps: a process per worker, per parameter server and a chief (ParameterServerStrategy).

    On one node `python -m trainscale.launch.tfrun` starts the processes with TF_CONFIG on free
    127.0.0.1 ports (and stops them all when one fails, or, for tf-ps, when the chief ends).
    Across SLURM nodes srun starts one task per process and the runner resolves the cluster
    from srun's environment, each node's tasks listening on the port the supervisor picked on
    the first node, +1, ... (tf-ps: task 0 the chief, then the servers, then the workers).
    """
    ps = [f"--ps={spec.ps_tasks}"] if spec.ps_tasks else []
    if spec.nodes == 1:
        tfrun = [env.python, "-m", "trainscale.launch.tfrun", f"--nproc={spec.workers}", *ps]
        return [*tfrun, "--", *worker]
    if env.mode != "slurm":
        raise ValueError(
            f"{spec.strategy} with nodes={spec.nodes} needs a SLURM allocation of that many"
        )
    cluster = ["env", "TRAINSCALE_TF_CLUSTER=slurm", f"TRAINSCALE_TF_PORT={env.port}"]
    if env.addrs:  # SlurmClusterResolver lists node names; workers dial their NodeAddr
        pairs = ",".join(f"{n}={a}" for n, a in zip(env.nodes, env.addrs, strict=True))
        cluster.append(f"TRAINSCALE_NODE_ADDRS={pairs}")
    return [*srun(spec, tasks_per_node(spec)), *cluster, env.python, *worker]


def horovodrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """horovodrun (`python -m horovod.runner.launch`) over gloo, one process per worker.

    Locally `-H localhost:N` on the loopback interface (without `--network-interface lo`
    elastic gloo waits silently for its timeout); every server horovodrun starts binds a port
    the OS has free, so several runs share a host. Across SLURM nodes the static form is
    `hvdrun` (each node's workers through srun, no ssh); the elastic form stays horovodrun,
    which starts each node's workers over ssh. The elastic form
    names a host discovery script (`trainscale.launch.horovod_hosts`) and lets the world shrink to
    one worker and grow back to the spec's. The workers inherit the environment horovodrun
    runs in (it exports it to remote hosts too), so the thread budget in `worker_env` reaches
    every one of them: horovodrun itself sets no OMP_NUM_THREADS.
    """
    if spec.nodes > 1 and env.mode != "slurm":
        raise ValueError(
            f"{spec.strategy} with nodes={spec.nodes} needs a SLURM allocation of that many"
        )
    local = spec.nodes == 1
    if not local and not catalog.STRATEGIES[spec.strategy].elastic:
        return hvdrun(spec, env, worker)
    cmd = [env.python, "-m", "horovod.runner.launch", "--gloo", "-np", str(spec.world_size)]
    if local:
        cmd += ["--network-interface", "lo"]
    if catalog.STRATEGIES[spec.strategy].elastic:
        discovery = f"{env.python} -m trainscale.launch.horovod_hosts --slots {spec.workers}"
        if not local and env.nodes:  # the job's nodes, from the controller (in_allocation)
            discovery += f" --hosts {','.join(env.nodes[: spec.nodes])}"
        cmd += ["--min-np", "1", "--max-np", str(spec.world_size)]
        cmd += ["--host-discovery-script", discovery]
    else:
        cmd += ["-H", f"localhost:{spec.workers}"]
    return [*cmd, env.python, *worker]


def hvdrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """Static Horovod across SLURM nodes: `trainscale.launch.hvdrun` starts gloo's rendezvous
    on the first node and each node's workers through `srun` (one task per node), inside the
    job's step, as horovodrun would over ssh."""
    hosts = ",".join(f"{h}:{spec.workers}" for h in env.nodes[: spec.nodes])
    line = [env.python, "-m", "trainscale.launch.hvdrun", "--hosts", hosts]
    line += ["--np", str(spec.world_size), "--addr", env.head]
    return [*line, "--srun", shlex.join(srun(spec, 1)), "--", env.python, *worker]


#: launcher form (a catalog row's `launcher`) -> the function building its command line
LAUNCHER_FORMS: dict[str, Callable[[RunSpec, Environment, list[str]], list[str]]] = {
    "single-process": single_process,
    "torchrun": torchrun,
    "tfrun": tfrun,
    "horovodrun": horovodrun,
}
#: strategy -> function building its launcher's command line
LAUNCHERS: dict[str, Callable[[RunSpec, Environment, list[str]], list[str]]] = {
    s.name: LAUNCHER_FORMS[s.launcher] for s in catalog.STRATEGIES.values()
}


def command(spec: RunSpec, env: Environment, out: str) -> list[str]:
    """The command line that runs `spec` in `env` and writes metrics to `out`."""
    try:
        launcher = LAUNCHERS[spec.strategy]
    except KeyError:
        raise ValueError(f"strategy {spec.strategy!r} has no launcher in this version") from None
    worker = ["-m", "trainscale.runners", "--spec", spec.to_json(), "--out", out]
    extra = {**dict(env.variables), **worker_env(spec, env)}
    if spec.horovod_timeline:  # Horovod's timeline, kept beside the run's metrics
        extra["HOROVOD_TIMELINE"] = str(Path(out).parent / "horovod-timeline.json")
    prefix = ["env", *(f"{k}={v}" for k, v in sorted(extra.items()))]
    cpus = spec.workers * (spec.threads_per_worker + spec.loader_workers)
    cpus += (spec.processes - spec.world_size) * spec.threads_per_worker  # tf-ps: servers, chief
    if env.container is not None and spec.own_model is not None:  # its code, bound in too
        c = env.container
        env = dataclasses.replace(
            env, container=dataclasses.replace(c, mounts=(*c.mounts, *spec.own_model.code))
        )
    return in_image(env, prefix, cpus, lambda e: launcher(spec, e, worker))


def in_image(
    env: Environment, prefix: list[str], cpus: int, form: Callable[[Environment], list[str]]
) -> list[str]:
    """`form(env)`'s command line, the variables of `prefix` (`env NAME=value ...`) set for it;
    inside env.container where there is one (its image's python; a one-node run under pyxis
    gets an srun of the node's `cpus` to enter the image)."""
    if env.container is None:
        return [*prefix, *form(env)]
    argv = form(dataclasses.replace(env, python=images.PYTHON))
    # the checkout's trainscale, whatever PYTHONPATH the image sets (pyxis keeps an image's
    # own values of the variables it passes on)
    prefix = ["env", f"PYTHONPATH={env.container.package}", *prefix[1:]]
    one_node = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}"]
    return images.wrap(argv, prefix, env.container, [*one_node, "--kill-on-bad-exit=1"])


def tasks_per_node(spec: RunSpec) -> int:
    """SLURM tasks per node of a run: across nodes one per process for the tfrun strategies
    (srun starts each; tf-ps's servers and chief make some nodes hold one more: this is the
    most on one node), else one (torchrun or the runner starts the node's workers)."""
    if LAUNCHERS.get(spec.strategy) is not tfrun or spec.nodes == 1:
        return 1
    return -(-spec.processes // spec.nodes)


def probe_command(spec: RunSpec, env: Environment) -> list[str]:
    """The device probe (trainscale.launch.devices) in every task the run would have, inside
    the run's container where it has one."""

    def form(e: Environment) -> list[str]:
        argv = [e.python, "-m", "trainscale.launch.devices"]
        return [*srun(spec, tasks_per_node(spec)), *argv] if spec.nodes > 1 else argv

    return in_image(env, [], spec.workers * spec.threads_per_worker, form)


def job_environment(package_dir: str | os.PathLike, python: str) -> dict[str, str]:
    """PYTHONPATH and PATH for Snakemake's jobs: the package importable without installing it
    (conda envs hold only its dependencies), and `python` resolving to the interpreter that
    runs Snakemake, so `.venv/bin/snakemake` works without activating the venv."""
    pythonpath = [str(package_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    path = [str(Path(python).parent), os.environ.get("PATH", "")]
    return {"PYTHONPATH": os.pathsep.join(pythonpath), "PATH": os.pathsep.join(path)}

"""SLURM: where a run lands inside an allocation, how long it may take there, and what each
job asks of the cluster.

`detect` and `in_allocation` read the allocation (environment, `scontrol`); `deadline` stops a
run before the job's time limit so its record can be written; `slurm_request` is the one place
resource requests are made, so that every rule asks for what its command launches.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from trainscale.launch import container
from trainscale.launch.commands import Environment, tasks_per_node
from trainscale.plan.preflight import memory_parts
from trainscale.plan.runspec import RunSpec


def expand_nodelist(nodelist: str) -> tuple[str, ...]:
    """Expand SLURM's compressed host list ('n[1-3,5],gpu7') without needing scontrol."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        stem, ranges = m.group(1), m.group(2)
        if not ranges:
            hosts.append(stem)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{stem}{i:0{width}d}")
    return tuple(h for h in hosts if h)


PACKAGE_DIR = container.PACKAGE_DIR


def detect(environ: dict[str, str] | None = None) -> Environment:
    """Local host, or the SLURM allocation this process runs in (SLURM_JOB_ID is set); the
    container and variables the Snakefile handed to the job (launch.container)."""
    environ = dict(os.environ if environ is None else environ)
    job = environ.get("SLURM_JOB_ID")
    cache = str(Path.cwd() / ".cache")  # the workflow's working directory
    image, variables = container.from_environ(environ, str(Path.cwd()), PACKAGE_DIR)
    given = {"python": sys.executable, "cache_dir": cache, "container": image}
    if not job:
        return Environment(mode="local", variables=variables, **given)
    nodes = expand_nodelist(environ.get("SLURM_JOB_NODELIST", ""))
    return Environment(mode="slurm", nodes=nodes, job_id=job, variables=variables, **given)


def scontrol_fields(text: str) -> dict[str, str]:
    """`scontrol show ... -o` output (one `Key=Value` line per record) as a dict."""
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


def slurm_seconds(value: str) -> float | None:
    """SLURM's `[days-][hours:]minutes:seconds` as seconds; None for UNLIMITED and the like."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", value.strip())
    if not m:
        return None
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def _scontrol(*args: str) -> str:
    try:
        out = subprocess.run(
            ["scontrol", *args], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout


def in_allocation(env: Environment, spec: RunSpec, scontrol=_scontrol) -> Environment:
    """Complete a SLURM environment from the controller: the job's nodes (Snakemake's jobstep
    executor drops SLURM_JOB_NODELIST from the job's environment), their NodeAddr for
    rendezvous across nodes, and the job's time left (so the run stops, and is recorded as a
    timeout, before SLURM's time limit kills the job with nothing written), and how often
    SLURM requeued it."""
    if env.mode != "slurm" or not env.job_id:
        return env
    job = scontrol_fields(scontrol("show", "job", "-o", env.job_id))
    nodes = env.nodes or expand_nodelist(job.get("NodeList", ""))
    addrs: tuple[str, ...] = ()
    if spec.nodes > 1 and nodes:
        found = {}
        for line in scontrol("show", "node", "-o", ",".join(nodes)).splitlines():
            f = scontrol_fields(line)
            found[f.get("NodeName")] = f.get("NodeAddr")
        addrs = tuple(found.get(n) or n for n in nodes)
    limit, ran = slurm_seconds(job.get("TimeLimit", "")), slurm_seconds(job.get("RunTime", ""))
    left = limit - ran if limit is not None and ran is not None else None
    restarts = int(job["Restarts"]) if job.get("Restarts", "").isdigit() else None
    return dataclasses.replace(
        env, nodes=nodes, addrs=addrs, time_limit=limit, time_left=left, restarts=restarts
    )


#: Seconds before SLURM's time limit at which a run is stopped, to write its timeout record
#: (the job then ends COMPLETED with that record, instead of TIMEOUT with no output).
SLURM_MARGIN_SECONDS = 30


def deadline(spec: RunSpec, env: Environment) -> tuple[float, str]:
    """(seconds the run may take, why that long): the run's own timeout, or less where the
    SLURM job it runs in ends sooner."""
    own = spec.timeout_minutes * 60
    why = f"timeout: no result after timeout_minutes={spec.timeout_minutes}"
    if env.time_left is not None and env.time_left - SLURM_MARGIN_SECONDS < own:
        limit = env.time_limit or 0
        return max(env.time_left - SLURM_MARGIN_SECONDS, 1.0), (
            f"timeout: SLURM time limit of job {env.job_id} (TimeLimit {limit / 60:g} min, "
            f"sbatch -t / the `runtime` resource) reached before the run finished; stopped "
            f"{SLURM_MARGIN_SECONDS} s before it so that this record could be written"
        )
    return own, why


def slurm_request(
    workers: int,
    nodes: int,
    threads_per_worker: int,
    accelerator: str,
    timeout_minutes: float,
    tasks_per_node: int = 1,
    servers: int = 0,
) -> dict[str, int | str]:
    """The snakemake-executor-plugin-slurm resources of any job that starts `workers` processes
    on each of `nodes` nodes: a training run, the all-reduce benchmark of that shape, the
    device probe, a build. The one place SLURM requests are made, so that every rule asks for
    what its command launches.

    torchrun and single-process forms run one task per node holding all of the node's workers
    (cpus_per_task = workers × threads_per_worker); tf-multiworker across nodes runs one task
    per worker (`tasks_per_node`). A multi-node job runs its own `srun`, so it sets `mpi`
    (otherwise the jobstep executor wraps it in `srun -n1` and the inner srun finds one node,
    or waits for CPUs until the time limit). GPUs are requested per node (`gres`), one per
    worker, with `tasks_per_gpu=0` so the plugin does not turn `tasks` into --ntasks-per-gpu.
    `runtime` is the job's own timeout plus start-up slack, so that timeout fires first and is
    recorded. `servers` are processes beside the workers with the same thread budget and no
    GPU (tf-ps: its parameter servers and its chief): their cores are asked for too.
    """
    processes = workers * nodes + servers
    tasks = min(nodes * tasks_per_node, processes)
    res: dict[str, int | str] = {
        "nodes": nodes,
        "tasks": tasks,
        "cpus_per_task": threads_per_worker * -(-processes // tasks),
        "runtime": math.ceil(timeout_minutes) + 5,
    }
    if nodes > 1:
        res["mpi"] = "srun"
        if tasks_per_node > 1:
            res["slurm_extra"] = f"--ntasks-per-node={tasks_per_node}"
    if accelerator == "cuda":
        res["gres"] = f"gpu:{workers}"
        res["tasks_per_gpu"] = 0
    return res


def with_options(
    res: dict[str, int | str], options: Mapping | None, accelerator: str
) -> dict[str, int | str]:
    """A job's request with config `slurm`: `exclusive` (sbatch --exclusive: no other job on
    its nodes), `constraint` (sbatch -C: the node features it needs) and `gpus_per_node` (the
    GPUs asked of each node, where they differ from its workers: a node of 8 GPUs for a cell
    of 4; the planner drops cells of more workers than that). Under `exclusive` a job's memory
    is the whole node's (`WHOLE_NODE`)."""
    options = options or {}
    res = dict(res)
    if options.get("exclusive"):
        res["slurm_extra"] = " ".join(filter(None, [res.get("slurm_extra"), "--exclusive"]))
        if MEMORY_KEY in res:  # the node is the job's: a predicted --mem only risks an OOM
            res[MEMORY_KEY] = WHOLE_NODE
    if options.get("constraint"):
        res["constraint"] = options["constraint"]
    if options.get("gpus_per_node") and accelerator == "cuda":
        res["gres"] = f"gpu:{options['gpus_per_node']}"
    return res


#: Every resource key `slurm_request` and `with_options` may set (rules declare each, None
#: where a job needs none).
SLURM_RESOURCE_KEYS = (
    "nodes",
    "tasks",
    "cpus_per_task",
    "runtime",
    "mpi",
    "gres",
    "tasks_per_gpu",
    "slurm_extra",
    "constraint",
)
#: The memory resource every job that starts processes sets (slurm_resources, collectives_mem_mb,
#: build_mem_mb), never None (Snakemake refuses a memory resource of None).
MEMORY_KEY = "mem_mb"
#: mem_mb of a job under config `slurm.exclusive`: sbatch --mem=0, all of each node's memory.
#: The plugin sends no --mem for 0; the Snakefile sets SBATCH_MEM_PER_NODE=0 (sbatch's
#: variable for --mem) for such a study, so that sbatch asks for the whole node.
WHOLE_NODE = 0
#: memory of one compiler process of a build job (nvcc's cicc and g++ on DeepSpeed's fused
#: CUDA kernels and Horovod's ops): 2 GiB, an estimate above the ~1-1.5 GiB such translation
#: units are commonly reported at (not measured by trainscale); a build runs one per CPU
BUILD_BYTES_PER_CPU = 2 * 2**30


def build_mem_mb(cpus: int) -> int:
    """A build job's memory (MB): a compiler process per CPU (MAX_JOBS), and the Python that
    drives it (BUILD_BYTES_PER_CPU; memory_parts.LAUNCHER_BYTES)."""
    return -(-(cpus * BUILD_BYTES_PER_CPU + memory_parts.LAUNCHER_BYTES) // 2**20)


def collectives_mem_mb(train_mem_mb: list[int]) -> int:
    """The all-reduce benchmark of a (workers, nodes) shape: the largest request of the
    training runs of that shape. A benchmark rank holds the framework and one message no
    larger than the study's largest gradient; a training rank of the same shape holds those
    and its model, optimizer state and data besides, so it never needs less."""
    return max(train_mem_mb)


def slurm_resources(
    spec: RunSpec,
    accelerator: str,
    host_bytes: int | None = None,
    options: Mapping | None = None,
) -> dict[str, int | str]:
    """The SLURM resources of a training run (see `slurm_request`); with `host_bytes` (the
    planner's host memory per rank, trainscale.plan.preflight.memory) its memory per node: `mem_mb`
    (sbatch --mem) = its ranks on a node × host_bytes, a margin over it and the launcher's
    process (memory_parts.slurm_mem_mb); and config `slurm`'s `options` (`with_options`). A
    `set-resources` of the profile still wins."""
    res = slurm_request(
        spec.workers,
        spec.nodes,
        spec.threads_per_worker + spec.loader_workers,
        accelerator,
        spec.timeout_minutes,
        tasks_per_node(spec),
        spec.processes - spec.world_size,
    )
    if host_bytes is not None:
        res["mem_mb"] = memory_parts.slurm_mem_mb(spec, host_bytes)
    return with_options(res, options, accelerator)

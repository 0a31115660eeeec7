"""Where a tf-ps process sits (tf_ps.py): its role in the cluster (chief, parameter server or
worker) from the TF_CONFIG `trainscale.launch.tfrun --ps` gave it or from srun's tasks, the GPU
a worker takes, and the server loop of the servers and workers.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import json  # noqa: E402

import tensorflow as tf  # noqa: E402

from trainscale.launch import tfrun  # noqa: E402
from trainscale.launch.slurm import expand_nodelist  # noqa: E402
from trainscale.plan.machine import gpu_count  # noqa: E402
from trainscale.plan.runspec import RunSpec  # noqa: E402
from trainscale.runners.device_check import process_rank, require_gpu  # noqa: E402
from trainscale.runners.tensorflow.tf import at_node_addrs  # noqa: E402


def slurm_tasks_per_node(value: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE ('2(x3),1') as one count per node."""
    out: list[int] = []
    for part in value.split(","):
        count, _, times = part.partition("(x")
        out += [int(count)] * int(times.rstrip(")") or 1)
    return out


def slurm_tf_config(environ: dict[str, str], ps_tasks: int) -> dict:
    """TF_CONFIG of this srun task: the cluster of every task of the step (srun's block
    distribution: task ids fill each node in turn), each node's tasks on TRAINSCALE_TF_PORT,
    +1, ..., node names replaced by their NodeAddr; task 0 the chief, then the servers, then
    the workers (`tfrun.ps_roles`)."""
    nodes = expand_nodelist(environ["SLURM_STEP_NODELIST"])
    counts = slurm_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    base = int(environ.get("TRAINSCALE_TF_PORT") or 8888)
    addresses = [f"{n}:{base + j}" for n, c in zip(nodes, counts, strict=True) for j in range(c)]
    addresses = at_node_addrs(addresses, environ.get("TRAINSCALE_NODE_ADDRS", ""))
    task = int(environ["SLURM_PROCID"])
    workers = len(addresses) - 1 - ps_tasks
    kind, index = tfrun.ps_roles(workers, ps_tasks)[task]
    cluster = tfrun.ps_cluster(addresses, ps_tasks)
    return {"cluster": cluster, "task": {"type": kind, "index": index}}


def tf_config(spec: RunSpec) -> dict:
    """This process's TF_CONFIG: from srun's environment under SLURM (the launcher sets
    TRAINSCALE_TF_CLUSTER=slurm), else the one `trainscale.launch.tfrun --ps` gave it; checked
    against the spec, so that a wrong launch fails before it trains."""
    if os.environ.get("TRAINSCALE_TF_CLUSTER") == "slurm":
        config = slurm_tf_config(dict(os.environ), spec.ps_tasks)
    elif "TF_CONFIG" in os.environ:
        config = json.loads(os.environ["TF_CONFIG"])
    else:
        raise RuntimeError(
            "tf-ps needs TF_CONFIG: start it with `python -m trainscale.launch.tfrun --nproc N "
            "--ps P -- -m trainscale.runners ...` (trainscale.launch does) or under srun"
        )
    cluster = config["cluster"]
    shape = (len(cluster.get("chief", [])), len(cluster.get("ps", [])), len(cluster["worker"]))
    if shape != (1, spec.ps_tasks, spec.world_size):
        raise RuntimeError(
            f"the cluster has (chief, ps, workers) = {shape}, the run needs "
            f"{(1, spec.ps_tasks, spec.world_size)}"
        )
    return config


def node_gpus(spec: RunSpec) -> int:
    """The GPUs of this process's node, counted before TensorFlow starts CUDA. Every process of
    a cuda run, the chief's and the servers' too, stops on a node without (the chief's error
    is the one the record shows)."""
    gpus = gpu_count()
    build = tf.sysconfig.get_build_info()
    cuda = build.get("cuda_version") if build.get("is_cuda_build") else None
    require_gpu(spec.accelerator, f"TensorFlow {tf.__version__}", gpus, cuda, process_rank())
    return gpus


def worker_gpu_slot(config: dict, environ: dict[str, str]) -> int:
    """Which of its node's GPUs a worker takes: its LOCAL_RANK from tfrun, or under SLURM the
    number of workers on its node before it (the chief and the servers take none)."""
    if "SLURM_PROCID" not in environ or "SLURM_LOCALID" not in environ:
        return int(environ.get("LOCAL_RANK", config["task"]["index"]))
    task, local = int(environ["SLURM_PROCID"]), int(environ["SLURM_LOCALID"])
    first_worker = 1 + len(config["cluster"]["ps"])  # task id of worker 0
    return sum(1 for t in range(task - local, task) if t >= first_worker)


def hide_or_pick_gpu(config: dict, gpus: int) -> None:
    """Before TensorFlow starts CUDA: the chief and the servers see no GPU (the variables live
    on the servers' CPUs), a worker sees one."""
    if config["task"]["type"] != "worker" or not gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    ids = visible or [str(i) for i in range(gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[worker_gpu_slot(config, dict(os.environ)) % len(ids)]


def serve(spec: RunSpec, config: dict) -> None:
    """A worker or a parameter server: serve the cluster until stopped (never returns).

    Its compute is held to threads_per_worker intra-op threads. The inter-op pool keeps
    TensorFlow's default: with one inter-op thread (tf.py's setting) the servers deadlock, as
    a remote step's ops wait there for the variable reads they issue themselves (measured: a
    1-worker run on digits hung until its timeout).
    """
    threads = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=spec.threads_per_worker, inter_op_parallelism_threads=0
    )
    if config["task"]["type"] == "worker":
        threads.gpu_options.allow_growth = True
    server = tf.distribute.Server(
        tf.train.ClusterSpec(config["cluster"]),
        job_name=config["task"]["type"],
        task_index=config["task"]["index"],
        protocol="grpc",
        config=threads,
        start=True,
    )
    server.join()


def processes_on_this_node(spec: RunSpec) -> int:
    """Processes of the run on the chief's node, each a unit of threads_per_worker threads:
    all of them on one node; under srun the tasks it placed here (SLURM_STEP_TASKS_PER_NODE's
    first node, the chief's)."""
    if spec.nodes == 1 or "SLURM_STEP_TASKS_PER_NODE" not in os.environ:
        return spec.processes
    return slurm_tasks_per_node(os.environ["SLURM_STEP_TASKS_PER_NODE"])[0]

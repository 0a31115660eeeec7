"""TensorFlow/Keras plug-ins on the Keras loop (keras_loop.py): one device (`tf`),
MirroredStrategy (`tf-mirrored`), MultiWorkerMirroredStrategy (`tf-multiworker`, one process per
worker, started by `trainscale.launch.tfrun` or `srun`).

In the style of TensorFlow's distributed-training guides: build and compile under
`strategy.scope()`, feed a `tf.data` pipeline with the global batch, let the strategy split it.
Worker 0 (the chief) writes the metrics.

On a machine without GPUs, `tf-mirrored` with workers > 1 runs N *logical* CPU devices in one
process (`tf.config.set_logical_device_configuration`): it proves the code path, not a speed-up
(the devices share the process's cores and thread pools); the metrics say so in
`device.logical`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainscale.plan.matrix import RunSpec  # noqa: E402
from trainscale.runners.tensorflow import keras_loop as loop  # noqa: E402

HOST_BYTES = 64  # host names travel between workers as this many bytes


# --- where a tf-multiworker process sits: the cluster -----------------------------------------


def at_node_addrs(workers: list[str], pairs: str) -> list[str]:
    """Worker `node:port` entries with SLURM node names replaced by their NodeAddr (`n1=addr,...`
    from the launcher): node names need not resolve, NodeAddr is what SLURM itself dials. Where
    several nodes share an address (slurmd daemons on one host), each worker gets its own port:
    the first port + its index, the same on every worker."""
    addrs = dict(p.split("=", 1) for p in pairs.split(",") if "=" in p)
    split = [w.rsplit(":", 1) for w in workers]
    out = [f"{addrs.get(h, h)}:{p}" for h, p in split]
    if len(set(out)) < len(out):
        base = min(int(p) for _, p in split)
        out = [f"{addrs.get(h, h)}:{base + i}" for i, (h, _) in enumerate(split)]
    return out


def cluster_resolver(spec: RunSpec, gpus: bool):
    """(resolver, local rank) of a tf-multiworker process.

    Under SLURM (the launcher sets TRAINSCALE_TF_CLUSTER=slurm) the cluster comes from srun's
    environment through SlurmClusterResolver, each node's workers on ports TRAINSCALE_TF_PORT,
    +1, ...; locally from the TF_CONFIG that `trainscale.launch.tfrun` gives every worker.
    """
    if os.environ.get("TRAINSCALE_TF_CLUSTER") == "slurm":
        # SlurmClusterResolver hands out one port per GPU slot (with 0 GPUs it lists no task at
        # all), so it is asked for one slot per worker and never sets CUDA_VISIBLE_DEVICES (this
        # runner picks a GPU by local rank); the cluster it resolves is then handed to the
        # strategy with the true accelerator count, which MultiWorkerMirroredStrategy reads.
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs={"worker": spec.world_size},
            port_base=int(os.environ.get("TRAINSCALE_TF_PORT") or 8888),
            gpus_per_node=spec.workers,
            gpus_per_task=1,
            tasks_per_node=spec.workers,
            auto_set_gpu=False,
        )
        cluster = slurm.cluster_spec().as_dict()
        cluster["worker"] = at_node_addrs(
            cluster["worker"], os.environ.get("TRAINSCALE_NODE_ADDRS", "")
        )
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster),
            task_type=slurm.task_type,
            task_id=slurm.task_id,
            num_accelerators={"GPU": 1 if gpus else 0},
            rpc_layer="grpc",
        )
        return resolver, int(os.environ.get("SLURM_LOCALID", "0"))
    if "TF_CONFIG" not in os.environ:
        raise RuntimeError(
            "tf-multiworker needs TF_CONFIG: start it with `python -m trainscale.launch.tfrun "
            "--nproc N -- -m trainscale.runners ...` (trainscale.launch does) or under srun"
        )
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    workers = len(resolver.cluster_spec().as_dict().get("worker", []))
    if workers != spec.world_size:
        raise RuntimeError(f"TF_CONFIG lists {workers} workers, the run needs {spec.world_size}")
    return resolver, int(os.environ.get("LOCAL_RANK", resolver.task_id % spec.workers))


class OneDevice(loop.KerasStrategy):
    """`tf`: plain Keras on the one device this process sees (its first GPU, or the CPU)."""

    def configure(self) -> loop.Placement:
        loop.set_threads(self.spec, 1)
        gpus = loop.physical_gpus(self.spec)
        if gpus:
            loop.visible_gpus(gpus, 0, 1, self.spec.strategy)
        self.strategy = tf.distribute.get_strategy()
        return loop.Placement(rank=0, gpu=bool(gpus))


class Mirrored(loop.KerasStrategy):
    """`tf-mirrored`: one process, one replica per device, gradients all-reduced in-process
    (NCCL on GPUs; on CPU `workers` logical devices and a reduction to one device)."""

    def configure(self) -> loop.Placement:
        n = self.spec.workers
        loop.set_threads(self.spec, n)
        gpus = loop.physical_gpus(self.spec)
        logical = False
        if gpus:
            loop.visible_gpus(gpus, 0, n, self.spec.strategy)
            devices = [f"/device:GPU:{i}" for i in range(n)]
        else:
            if n > 1:  # no GPUs: N logical CPU devices share this process's cores
                cpu = tf.config.list_physical_devices("CPU")[0]
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
                )
                logical = True
            devices = [f"/device:CPU:{i}" for i in range(n)]
        cross = None if gpus else tf.distribute.ReductionToOneDevice()  # NCCL on GPUs
        self.strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross)
        return loop.Placement(rank=0, gpu=bool(gpus), replicas=n, logical=logical)


class MultiWorker(loop.KerasStrategy):
    """`tf-multiworker`: one process per worker, gradients all-reduced across processes
    (NCCL on GPUs, a gRPC ring on CPU); the cluster from TF_CONFIG or SLURM."""

    def configure(self) -> loop.Placement:
        loop.set_threads(self.spec, 1)
        gpus = loop.physical_gpus(self.spec)
        resolver, local_rank = cluster_resolver(self.spec, bool(gpus))
        if gpus:
            loop.visible_gpus(gpus, local_rank, 1, self.spec.strategy)
        impl = tf.distribute.experimental.CommunicationImplementation
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl.NCCL if gpus else impl.RING
            ),
        )
        return loop.Placement(rank=resolver.task_id, gpu=bool(gpus))

    def gather(self, row: list[float | None], host: str) -> list[tuple[list[float | None], str]]:
        """An all-gather over the workers (None travels as NaN, the host name as bytes)."""
        name = np.zeros(HOST_BYTES)
        raw = host.encode()[:HOST_BYTES]
        name[: len(raw)] = list(raw)
        mine = np.concatenate([loop.nan_for_none(row), name])[None]
        strategy = self.strategy

        @tf.function
        def all_gather():
            def fn():
                ctx = tf.distribute.get_replica_context()
                return ctx.all_gather(tf.constant(mine, tf.float64), axis=0)

            return strategy.run(fn)

        table = strategy.experimental_local_results(all_gather())[0].numpy()
        k = len(row)
        decoded = (bytes(int(b) for b in r[k:] if b).decode(errors="replace") for r in table)
        return [(loop.none_for_nan(r[:k]), h) for r, h in zip(table, decoded, strict=True)]


PLUGINS: dict[str, type[loop.KerasStrategy]] = {
    "tf": OneDevice,
    "tf-mirrored": Mirrored,
    "tf-multiworker": MultiWorker,
}


def main(spec: RunSpec, out: str) -> None:
    loop.run(PLUGINS[spec.strategy](spec), out)

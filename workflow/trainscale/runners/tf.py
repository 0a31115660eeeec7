"""TensorFlow/Keras: one device (`tf`), MirroredStrategy (`tf-mirrored`), MultiWorkerMirrored-
Strategy (`tf-multiworker`, one process per worker, started by `trainscale.tfrun` or `srun`).

One Keras `model.fit` for all three, in the style of TensorFlow's distributed-training guides:
build and compile under `strategy.scope()`, feed a `tf.data` pipeline with the global batch,
let the strategy split it. Every strategy uses tf-keras 2 (`TF_USE_LEGACY_KERAS=1`): Keras 3's
`model.fit` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585) and Horovod's
Keras integration needs Keras 2, so one Keras serves every TensorFlow strategy alike.

What makes the comparison with PyTorch fair: the same arrays and normalisation
(`trainscale.data`, x / x_max, then per-channel mean/std), the same architectures
(`trainscale.keras_models`, parameter counts tested equal), the same optimizer and
hyper-parameters from the run spec, the same global batch, the same steps per epoch (remainder
dropped), and the same thread budget per worker. Worker 0 (the chief) writes the metrics.

On a machine without GPUs, `tf-mirrored` with workers > 1 runs N *logical* CPU devices in one
process (`tf.config.set_logical_device_configuration`): it proves the code path, not a speed-up
(the devices share the process's cores and thread pools); the metrics say so in
`device.logical`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data, keras_models, metrics  # noqa: E402
from trainscale.matrix import RunSpec  # noqa: E402
from trainscale.memory import PhasePeaks, memory_block  # noqa: E402
from trainscale.runners.common import (  # noqa: E402
    check_oversubscribed,
    check_steps,
    evaluates,
    fmt_rate,
    maybe_fault,
    steps_per_epoch,
)

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
HOST_BYTES = 64  # host names travel between workers as this many bytes


# --- where this process sits: cluster, devices, threads ----------------------------------------


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
    +1, ...; locally from the TF_CONFIG that `trainscale.tfrun` gives every worker.
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
            "tf-multiworker needs TF_CONFIG: start it with `python -m trainscale.tfrun --nproc N "
            "-- -m trainscale.runners ...` (trainscale.launch does) or under srun"
        )
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    workers = len(resolver.cluster_spec().as_dict().get("worker", []))
    if workers != spec.world_size:
        raise RuntimeError(f"TF_CONFIG lists {workers} workers, the run needs {spec.world_size}")
    return resolver, int(os.environ.get("LOCAL_RANK", resolver.task_id % spec.workers))


def configure(spec: RunSpec) -> tuple[tf.distribute.Strategy, dict]:
    """Threads, visible devices and the strategy; must run before TensorFlow starts its runtime.

    A worker (a process, or a logical device of tf-mirrored) gets `threads_per_worker` threads:
    intra-op threads = workers in this process × threads_per_worker, inter-op threads = workers
    in this process (one op at a time per worker, as a PyTorch process runs them).
    """
    gpus = tf.config.list_physical_devices("GPU")
    s = spec.strategy
    local = spec.workers if s == "tf-mirrored" else 1  # workers (replicas) in this process
    tf.config.threading.set_intra_op_parallelism_threads(local * spec.threads_per_worker)
    tf.config.threading.set_inter_op_parallelism_threads(local)
    resolver, local_rank = (None, 0)
    if s == "tf-multiworker":
        resolver, local_rank = cluster_resolver(spec, bool(gpus))
    facts = {"gpu": bool(gpus), "logical": False, "local_rank": local_rank, "replicas": local}
    if gpus:
        if len(gpus) >= local_rank + local:
            mine = gpus[local_rank : local_rank + local]  # a node's GPUs, this worker's share
        elif len(gpus) == local:
            mine = gpus  # the scheduler already gave each process its own
        else:
            raise RuntimeError(f"{s} with workers={spec.workers} needs {local} GPUs per process")
        tf.config.set_visible_devices(mine, "GPU")
        for g in mine:  # allocate as needed, so the peak is what the run used
            tf.config.experimental.set_memory_growth(g, True)
        devices = [f"/device:GPU:{i}" for i in range(local)]
    else:
        if local > 1:  # no GPUs: N logical CPU devices share this process's cores
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(local)]
            )
            facts["logical"] = True
        devices = [f"/device:CPU:{i}" for i in range(local)]
    if s == "tf":
        strategy = tf.distribute.get_strategy()  # plain Keras on the one visible device
    elif s == "tf-mirrored":
        cross = None if gpus else tf.distribute.ReductionToOneDevice()  # NCCL on GPUs
        strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross)
    else:
        impl = tf.distribute.experimental.CommunicationImplementation
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl.NCCL if gpus else impl.RING
            ),
        )
    facts["task"] = resolver.task_id if resolver else 0
    return strategy, facts


# --- data: the arrays the PyTorch runner uses, normalised the same way, NCHW -> NHWC -----------


def normaliser(arrays: data.Arrays):
    """uint8 NHWC batch -> float32, exactly as runners/pytorch.py: x / x_max, - mean, / std."""
    mean = tf.constant(np.asarray(arrays.mean, dtype=np.float32))
    std = tf.constant(np.asarray(arrays.std, dtype=np.float32))

    def f(x):
        return (tf.cast(x, tf.float32) / arrays.x_max - mean) / std

    return f


def pipeline_options(spec: RunSpec) -> tf.data.Options:
    """Auto-shard by data (every worker reads the same shuffled order and keeps its share of each
    global batch), and the input pipeline held to the thread budget of this process' workers."""
    o = tf.data.Options()
    o.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    local = spec.workers if spec.strategy == "tf-mirrored" else 1
    o.threading.private_threadpool_size = local * spec.threads_per_worker
    o.threading.max_intra_op_parallelism = 1
    return o


def train_dataset(spec: RunSpec, arrays: data.Arrays, x: np.ndarray, steps: int) -> tf.data.Dataset:
    """Epochs of `steps` global batches: the training set replicated `scale` times, reshuffled
    every epoch with the run's seed (the same order on every worker), remainder dropped; an
    epoch cut by `steps_per_epoch` takes the first `steps` batches of its order, as PyTorch's
    runners do, and the next epoch starts a new order."""
    n = len(arrays.train_y)
    total = n * spec.scale
    images, labels, norm = tf.constant(x), tf.constant(arrays.train_y), normaliser(arrays)

    def batch(idx):
        idx = idx % n
        return norm(tf.gather(images, idx)), tf.gather(labels, idx)

    return (
        tf.data.Dataset.range(total)
        .shuffle(total, seed=spec.seed, reshuffle_each_iteration=True)
        .batch(spec.global_batch_size, drop_remainder=True)
        .take(steps)
        .repeat()
        .map(batch)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(pipeline_options(spec))
    )


def eval_dataset(spec: RunSpec, arrays: data.Arrays, x: np.ndarray) -> tf.data.Dataset:
    """The test set in global batches of the training's (each replica scores its share of a
    batch, as many images as it trains on per step)."""
    norm = normaliser(arrays)
    return (
        tf.data.Dataset.from_tensor_slices((x, arrays.test_y))
        .batch(spec.global_batch_size)
        .map(lambda a, b: (norm(a), b))
        .with_options(pipeline_options(spec))
    )


def nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


# --- optimizer ---------------------------------------------------------------------------------


def make_optimizer(spec: RunSpec) -> keras.optimizers.Optimizer:
    """torch.optim.Adam / SGD with the spec's hyper-parameters.

    PyTorch's weight_decay is an L2 term added to the gradient (not AdamW's decoupled decay,
    which is what Keras' `weight_decay` means), so it is added here, after the gradients of all
    replicas are aggregated. Keras' Adam applies epsilon to sqrt(v) before bias correction
    (Kingma & Ba's "epsilon hat"); with eps = 1e-7 the two forms differ below float32 noise.
    """
    wd = spec.weight_decay
    if spec.optimizer == "adam":
        base = keras.optimizers.Adam
        kw = {"beta_1": spec.betas[0], "beta_2": spec.betas[1], "epsilon": spec.eps}
    else:
        base = keras.optimizers.SGD
        kw = {"momentum": spec.momentum}
    if not wd:
        return base(learning_rate=spec.lr, **kw)

    class CoupledWeightDecay(base):
        def update_step(self, gradient, variable):
            return super().update_step(gradient + wd * tf.cast(variable, gradient.dtype), variable)

    return CoupledWeightDecay(learning_rate=spec.lr, **kw)


# --- timing: a Keras callback, wall-clock ------------------------------------------------------


class EpochClock(keras.callbacks.Callback):
    """Wall-clock (`time.perf_counter`) seconds of each epoch's training steps and of each step.

    Keras converts a step's logs to numpy before `on_train_batch_end` for a callback like this
    one (no `_supports_tf_logs`), which waits for the step to finish; under the strategies every
    step ends in an all-reduce, so the epoch's end is synchronised across replicas and workers.
    `after_epoch(epoch, seconds, step_seconds, logs)` runs after the clock stops.
    """

    def __init__(self, after_epoch, mid_epoch=None, steps: int = 0) -> None:
        super().__init__()
        self.after_epoch = after_epoch
        self.mid_epoch, self.half = mid_epoch, steps // 2  # mid_epoch(epoch) at that step
        self._epoch = 0
        self._t_epoch = self._t_step = 0.0
        self._steps: list[float] = []

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = epoch + 1
        self._steps = []
        self._t_epoch = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        if self.mid_epoch and batch == self.half:
            self.mid_epoch(self._epoch)
        self._t_step = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self._steps.append(time.perf_counter() - self._t_step)

    def on_epoch_end(self, epoch, logs=None) -> None:
        seconds = time.perf_counter() - self._t_epoch
        self.after_epoch(epoch + 1, seconds, self._steps, dict(logs or {}))


# --- facts gathered from every worker ----------------------------------------------------------


def worker_facts(strategy, multiworker: bool, values: list[float | None], host: str):
    """Every worker's `values` and host name: [(values, host), ...], one entry per worker.

    Under MultiWorkerMirroredStrategy an all-gather collects them (float64 carries byte counts
    exactly; None travels as NaN); otherwise this process is the only one.
    """
    if not multiworker:
        return [(values, host)]
    name = np.zeros(HOST_BYTES)
    raw = host.encode()[:HOST_BYTES]
    name[: len(raw)] = list(raw)
    row = np.concatenate([[np.nan if v is None else v for v in values], name])[None]

    @tf.function
    def gather():
        def fn():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_gather(tf.constant(row, tf.float64), axis=0)

        return strategy.run(fn)

    table = strategy.experimental_local_results(gather())[0].numpy()
    k = len(values)
    out = []
    for r in table:
        vals = [None if math.isnan(v) else float(v) for v in r[:k]]
        out.append((vals, bytes(int(b) for b in r[k:] if b).decode(errors="replace")))
    return out


def first_gpu_ordinal() -> int:
    """CUDA ordinal of the first GPU this process trains on (its index among the physical GPUs,
    which TensorFlow numbers as CUDA does), for NVML: not the worker's rank, which differs
    where the scheduler gave each process its own GPU."""
    return tf.config.list_physical_devices("GPU").index(tf.config.get_visible_devices("GPU")[0])


def phase_peaks(gpu: bool, replicas: int) -> PhasePeaks:
    """Training's and evaluation's peak memory apart: host RSS, and on GPUs TensorFlow's peak
    over this process's replicas (reset with the host's at every evaluation's start and end)."""
    if not gpu:
        return PhasePeaks()
    names = [f"GPU:{i}" for i in range(replicas)]
    return PhasePeaks(
        lambda: max(tf.config.experimental.get_memory_info(d)["peak"] for d in names),
        lambda: [tf.config.experimental.reset_memory_stats(d) for d in names],
    )


# --- the run -----------------------------------------------------------------------------------


def main(spec: RunSpec, out: str) -> None:
    rec = metrics.Recorder(spec.to_dict())
    strategy, facts = configure(spec)
    multiworker = spec.strategy == "tf-multiworker"
    chief = facts["task"] == 0
    keras.mixed_precision.set_global_policy(POLICIES[spec.precision])
    keras.utils.set_random_seed(spec.seed)  # same fresh initial weights on every worker, repeat

    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
    train_x, test_x = nhwc(arrays.train_x), nhwc(arrays.test_x)
    train_samples = len(arrays.train_y) * spec.scale
    steps = steps_per_epoch(
        train_samples, spec.world_size, spec.per_worker_batch_size, spec.steps_per_epoch
    )
    check_steps(steps, spec.path, train_samples, spec.global_batch_size)
    train_ds = train_dataset(spec, arrays, train_x, steps)
    test_ds = eval_dataset(spec, arrays, test_x)

    with strategy.scope():
        model = keras_models.build(spec.model, arrays.info.shape, arrays.info.num_classes)
        model.compile(
            optimizer=make_optimizer(spec),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )

    synthetic = arrays.info.synthetic
    test = {"accuracy": None, "loss": None}
    memory = phase_peaks(facts["gpu"], facts["replicas"])

    def after_epoch(epoch: int, seconds: float, step_seconds: list[float], logs: dict) -> None:
        scored = evaluates(spec, synthetic, epoch)
        if scored:  # every worker evaluates: under the strategies evaluate is collective
            memory.evaluation_starts()
            result = model.evaluate(test_ds, verbose=0, return_dict=True)
            memory.evaluation_ends()
            test.update(accuracy=float(result["accuracy"]), loss=float(result["loss"]))
        e = rec.epoch(
            seconds,
            samples=steps * spec.global_batch_size,
            steps=steps,
            train_loss=float(logs["loss"]),
            step_seconds=step_seconds,
            test_accuracy=test["accuracy"] if scored and not synthetic else None,
            test_loss=test["loss"] if scored and not synthetic else None,
        )
        if chief:
            print(
                f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, "
                f"{fmt_rate(e['samples_per_second'])} samples/s, loss {logs['loss']:.4f}",
                flush=True,
            )

    gpu = metrics.GpuMonitor(
        read=metrics.GpuMonitor.nvml_reader(first_gpu_ordinal()) if facts["gpu"] else None
    )
    rec.training_starts()
    gpu.start()
    model.fit(
        train_ds,
        epochs=spec.epochs,
        steps_per_epoch=steps,
        callbacks=[EpochClock(after_epoch, lambda e: maybe_fault(spec, facts["task"], e), steps)],
        verbose=0,
    )
    utilization, energy = gpu.stop()

    # Peak memory: the max over workers; energy summed, utilisation averaged; every host name.
    mine = [*memory.finish(), utilization, energy]
    gathered = worker_facts(strategy, multiworker, mine, metrics.hostname())
    if not chief:
        return
    peaks = [max(v[i] for v, _ in gathered) for i in range(4)]
    utils = [v[4] for v, _ in gathered if v[4] is not None]
    energies = [v[5] for v, _ in gathered if v[5] is not None]
    env = metrics.environment(
        rec.start_utc,
        {"tensorflow": tf.__version__, "tf-keras": keras.__version__},
        [h for _, h in gathered],
    )
    if facts["gpu"]:
        env["cuda"] = tf.sysconfig.get_build_info().get("cuda_version")
        env["driver"] = metrics.driver_version()
        details = tf.config.experimental.get_device_details(tf.config.get_visible_devices("GPU")[0])
        name = details.get("device_name", "GPU")
    else:
        name = metrics.cpu_name()
        if facts["logical"]:  # so that every table showing the device says what it was
            name += f" (as {facts['replicas']} logical devices)"
    result = rec.record(
        model={"params": keras_models.param_count(model)},
        data={"train_samples": train_samples, "test_samples": len(arrays.test_y)},
        test={k: None if synthetic else v for k, v in test.items()},
        memory=memory_block(peaks, facts["gpu"]),
        device={
            "kind": "cuda" if facts["gpu"] else "cpu",
            "name": name,
            "count": spec.world_size if multiworker else spec.workers,
            "logical": facts["logical"],
            "utilization_mean": sum(utils) / len(utils) if utils else None,
            "energy_joules": sum(energies) if energies else None,
        },
        env=env,
        oversubscribed=check_oversubscribed(spec.workers, spec.threads_per_worker),
        launch=metrics.launch_info(),
    )
    metrics.write(out, result)
    if os.environ.get("TRAINSCALE_SAVE_WEIGHTS"):  # final weights, for equivalence tests
        np.savez(os.environ["TRAINSCALE_SAVE_WEIGHTS"], *model.get_weights())
    print(
        f"trainscale: ok, throughput {fmt_rate(result['throughput'])} samples/s, "
        f"test accuracy {test['accuracy'] if not synthetic else 'n/a'}; wrote {out}",
        flush=True,
    )

"""TensorFlow ParameterServerStrategy (`tf-ps`): a chief, `ps_tasks` parameter servers and
`workers` workers, one process each, started by `trainscale.launch.tfrun --ps` or by `srun`.

Training is asynchronous by design: the chief (the coordinator) runs tf-keras `model.fit` and
schedules each step on whichever worker is free; that worker reads the variables from the
servers, computes the gradient of its own batch and applies it there at once, without waiting
for any other worker. So the variables see `workers` times as many updates per epoch as under
the synchronous strategies, each of a per-worker batch (global / workers), computed from
variables that other workers may have moved meanwhile (stale gradients). An epoch covers the
same samples as every other strategy's: `steps` global batches are `steps × workers` worker
steps of global / workers samples. The variables are partitioned over the servers
(`FixedShardsPartitioner`, `ps_tasks` shards along the first axis).

What is shared with the other TensorFlow strategies (tf.py): the arrays and their
normalisation, the Keras models, the optimizer (PyTorch's update rules), the mixed-precision
policy and the thread budget: every process of the run (worker, server, chief) is a unit of
`threads_per_worker` threads, counted in the core budget. The servers and workers only serve
(`tf.distribute.Server.join`) until tfrun or srun stops them; the chief measures, evaluates the
test set with a local copy of the trained variables, and writes the metrics.

Not measured: the workers' and servers' memory and device utilisation (they run TensorFlow's
server loop, no Python of ours); `memory` is the chief's. Per-step times cannot be seen from
the chief either (a step's result is fetched only when it is waited for, which would make the
training synchronous), so `step_seconds_p50/p95` are null.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.launch import tfrun  # noqa: E402
from trainscale.launch.slurm import expand_nodelist  # noqa: E402
from trainscale.measure import divergence, metrics  # noqa: E402
from trainscale.measure.memory import PhasePeaks, memory_block  # noqa: E402
from trainscale.models import keras_models  # noqa: E402
from trainscale.plan import catalog  # noqa: E402
from trainscale.plan.machine import gpu_count  # noqa: E402
from trainscale.plan.runspec import RunSpec  # noqa: E402
from trainscale.runners import common  # noqa: E402
from trainscale.runners.device_check import process_rank, require_gpu  # noqa: E402
from trainscale.runners.guarded import Parts  # noqa: E402
from trainscale.runners.tensorflow import keras_flops  # noqa: E402
from trainscale.runners.tensorflow.keras_data import nhwc, normaliser  # noqa: E402
from trainscale.runners.tensorflow.keras_loop import POLICIES, make_optimizer  # noqa: E402
from trainscale.runners.tensorflow.tf import at_node_addrs  # noqa: E402

#: Beside every tf-ps result (env.note), so that no table reads it as synchronous training.
ASYNC_NOTE = (
    catalog.STRATEGIES["tf-ps"].results_note
    + "; an epoch's steps are worker steps (steps × workers); memory is the chief's"
)


# --- the cluster: which role this process has --------------------------------------------------


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


# --- data: each worker its shard, per-worker batches -------------------------------------------


def dataset_fn(spec: RunSpec, arrays: data.Arrays, x: np.ndarray):
    """The `tf.keras.utils.experimental.DatasetCreator` function: each worker's `pipeline`.

    Why neither the `InputContext`'s batch nor its shard: under ParameterServerStrategy each
    worker has one replica in sync and the context names one input pipeline (id 0), so
    `get_per_replica_batch_size(global)` is the global batch and `shard(1, 0)` keeps all of
    it. Measured at 2 workers: every worker step trained 64 samples where the record counted
    32, and both workers read the same sequence. The worker's index comes from the
    coordinator instead, inside the worker's closure."""

    def make(context: tf.distribute.InputContext) -> tf.data.Dataset:
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        return pipeline(spec, arrays, x, index)

    return make


def pipeline(spec: RunSpec, arrays: data.Arrays, x: np.ndarray, worker) -> tf.data.Dataset:
    """Worker `worker`'s batches: its shard of the training set replicated `scale` times
    (sample i goes to worker i mod workers), reshuffled every pass with the run's seed, in
    batches of its share of the global batch (per_worker_batch_size; the remainder dropped),
    repeated: a worker reads as many batches as the coordinator gives it steps."""
    n = len(arrays.train_y)
    total = n * spec.scale
    norm = normaliser(arrays)
    images, labels = tf.constant(x), tf.constant(arrays.train_y)

    def gather(idx):
        idx = idx % n
        return norm(tf.gather(images, idx)), tf.gather(labels, idx)

    options = tf.data.Options()
    options.threading.private_threadpool_size = spec.threads_per_worker
    options.threading.max_intra_op_parallelism = 1
    shard = total // spec.world_size
    return (
        tf.data.Dataset.range(total)
        .shard(spec.world_size, tf.cast(worker, tf.int64))
        .shuffle(shard, seed=spec.seed, reshuffle_each_iteration=True)
        .batch(spec.per_worker_batch_size, drop_remainder=True)
        .repeat()
        .map(gather)
        .prefetch(2)
        .with_options(options)
    )


# --- the chief: evaluation and timing ----------------------------------------------------------


def joined_weights(model) -> list[np.ndarray]:
    """The model's weights as a model outside the strategy holds them: Keras lists a
    partitioned variable's shards one by one (`_sharded_container` names the whole, as
    tf-keras' own optimizer reads it); they are read from the servers and joined along the
    first axis, the axis FixedShardsPartitioner cuts."""
    out, seen = [], set()
    for v in model.weights:
        whole = v._sharded_container() if hasattr(v, "_sharded_container") else None
        if whole is None:
            out.append(np.asarray(v.numpy()))
        elif id(whole) not in seen:
            seen.add(id(whole))
            out.append(np.concatenate([s.numpy() for s in whole.variables], axis=0))
    return out


def chief_evaluation(spec: RunSpec, weights: list, arrays: data.Arrays, x: np.ndarray):
    """(accuracy, loss, predicted labels) of the test set, on the chief, by a local model with
    `weights` (the trained variables, read from the servers with their shards joined): the
    labels are what a per-class accuracy or a confusion matrix is counted from. Outside
    `strategy.scope()` only: in it, the local model's variables would go to the servers."""
    local = keras_models.build(
        spec.model, arrays.info.shape, arrays.info.num_classes, spec.own_model
    )
    local.set_weights(weights)
    norm = normaliser(arrays)
    ds = tf.data.Dataset.from_tensor_slices(x).batch(spec.global_batch_size).map(norm)
    logits = tf.cast(local.predict(ds, verbose=0), tf.float32)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(arrays.test_y, logits)
    predicted = np.argmax(logits.numpy(), axis=1)
    return float(np.mean(predicted == arrays.test_y)), float(loss), predicted


class EpochClock(keras.callbacks.Callback):
    """Wall-clock seconds of each epoch, from its first scheduled step to the moment every
    scheduled step has finished (`ClusterCoordinator.join`). Logs stay remote values
    (`_supports_tf_logs`): turning a step's logs into numbers waits for that step, which would
    make the coordinator run one step at a time."""

    def __init__(self, coordinator, after_epoch, mid_epoch, steps: int) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self.coordinator, self.after_epoch = coordinator, after_epoch
        self.mid_epoch, self.half = mid_epoch, steps // 2
        self._epoch, self._t0 = 0, 0.0

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch, self._t0 = epoch + 1, time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        if batch == self.half:
            self.mid_epoch(self._epoch)

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.coordinator.join()
        seconds = time.perf_counter() - self._t0
        self.after_epoch(epoch + 1, seconds, float(logs["loss"]))


# --- the run -----------------------------------------------------------------------------------


def main(spec: RunSpec, out: str) -> None:
    config = tf_config(spec)
    gpus = gpu_count()
    # every process of a cuda run, the chief's and the servers' too, stops on a node without
    # GPUs (the chief's error is the one the record shows)
    build = tf.sysconfig.get_build_info()
    cuda = build.get("cuda_version") if build.get("is_cuda_build") else None
    require_gpu(spec.accelerator, f"TensorFlow {tf.__version__}", gpus, cuda, process_rank())
    hide_or_pick_gpu(config, gpus)
    if config["task"]["type"] != "chief":
        serve(spec, config)
        return
    rec = metrics.Recorder(spec.to_dict())
    tf.config.threading.set_intra_op_parallelism_threads(spec.threads_per_worker)
    tf.config.threading.set_inter_op_parallelism_threads(0)  # TensorFlow's default: see serve
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(config["cluster"]), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(
            spec.ps_tasks
        ),
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    keras.mixed_precision.set_global_policy(POLICIES[spec.precision])
    keras.utils.set_random_seed(spec.seed)
    rec.timeline.ends("rendezvous")  # the set-up's phases, for the record's timeline

    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
    train_x, test_x = nhwc(arrays.train_x), nhwc(arrays.test_x)
    train_samples = len(arrays.train_y) * spec.scale
    steps = common.steps_per_epoch(
        train_samples, spec.world_size, spec.per_worker_batch_size, spec.steps_per_epoch
    )
    common.check_steps(steps, spec.path, train_samples, spec.global_batch_size)
    worker_steps = steps * spec.world_size  # each one worker's batch: the same samples
    rec.timeline.ends("data")

    with strategy.scope():
        model = keras_models.build(
            spec.model, arrays.info.shape, arrays.info.num_classes, spec.own_model
        )
        model.compile(
            optimizer=make_optimizer(spec),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    rec.timeline.ends("model")

    synthetic = arrays.info.synthetic
    snapshots: dict[int, list[np.ndarray]] = {}  # epoch -> trained weights, scored after fit

    def after_epoch(epoch: int, seconds: float, loss: float) -> None:
        watch = rec.losses  # only the epoch's mean loss is read here (logs stay remote)
        if watch.first_unsound([loss]) is not None:  # put at the epoch's last step
            watch.diverged = divergence.Divergence(epoch, worker_steps, loss, watch.last)
            model.stop_training = True
            print(f"epoch {epoch}/{spec.epochs}: {watch.diverged.message()}", flush=True)
            return
        watch.epoch(epoch, [loss])
        if common.evaluates(spec, synthetic, epoch):  # fit runs in strategy.scope(): score later
            snapshots[epoch] = joined_weights(model)
        e = rec.epoch(
            seconds,
            samples=worker_steps * spec.per_worker_batch_size,
            steps=worker_steps,
            train_loss=loss,
            step_seconds=[],
        )
        print(
            f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, "
            f"{common.fmt_rate(e['samples_per_second'])} samples/s, loss {loss:.4f}",
            flush=True,
        )

    clock = EpochClock(
        coordinator, after_epoch, lambda e: common.maybe_fault(spec, 0, e), worker_steps
    )
    rec.training_starts()
    model.fit(
        keras.utils.experimental.DatasetCreator(dataset_fn(spec, arrays, train_x)),
        epochs=spec.epochs,
        steps_per_epoch=worker_steps,
        callbacks=[clock],
        verbose=0,
    )
    memory = PhasePeaks()  # the chief's host memory: training's, then evaluation's
    test: dict = {"accuracy": None, "loss": None}
    # the chief's evaluation and measurements after training: each may fail, the run goes on
    parts = Parts(spec, rec.warnings, timeline=rec.timeline)
    memory.evaluation_starts()
    classes = arrays.info.num_classes

    def scores(weights: list) -> dict:
        accuracy, test_loss, predicted = chief_evaluation(spec, weights, arrays, test_x)
        confusion = np.zeros((classes, classes), np.int64)  # rows true, columns predicted
        np.add.at(confusion, (np.asarray(arrays.test_y), np.asarray(predicted)), 1)
        return {"accuracy": accuracy, "loss": test_loss, "confusion": confusion.tolist()}

    for epoch, weights in snapshots.items():
        scored = parts.run("evaluation", lambda w=weights: scores(w), epoch=epoch)
        if scored is None:
            test = {"accuracy": None, "loss": None}
            break
        rec.epochs[epoch - 1].update(test_accuracy=scored["accuracy"], test_loss=scored["loss"])
        test.update(scored)
    memory.evaluation_ends()
    peaks = parts.run("memory", lambda: list(memory.finish()))

    env = metrics.environment(
        rec.start_utc,
        {"tensorflow": tf.__version__, "tf-keras": keras.__version__},
        [metrics.hostname()],
    )
    env.update(ps_tasks=spec.ps_tasks, note=ASYNC_NOTE)
    if gpus:
        env["driver"] = metrics.driver_version()
    counted = parts.run(
        "flops",
        lambda: keras_flops.counted(
            spec, arrays.info.shape, arrays.info.num_classes, None, out, spec.world_size
        ),
    )
    result = rec.record(
        flops=counted,
        model={"params": keras_models.param_count(model)},
        data={"train_samples": train_samples, "test_samples": len(arrays.test_y)},
        test={k: None if synthetic else v for k, v in test.items()},
        memory=memory_block(peaks, False)
        if peaks is not None
        else {"peak_host_rss_bytes": None, "peak_device_bytes": None},
        device={
            "kind": "cuda" if gpus else "cpu",
            "name": "GPU" if gpus else metrics.cpu_name(),
            "count": spec.world_size,
            "logical": False,
            "utilization_mean": None,
            "energy_joules": None,
        },
        env=env,
        oversubscribed=metrics.oversubscribed(
            1, spec.threads_per_worker * processes_on_this_node(spec), metrics.cpu_count()
        ),
        launch=metrics.launch_info(),
    )
    common.write_ok(out, result, test["accuracy"] if not synthetic else "n/a")


def processes_on_this_node(spec: RunSpec) -> int:
    """Processes of the run on the chief's node, each a unit of threads_per_worker threads:
    all of them on one node; under srun the tasks it placed here (SLURM_STEP_TASKS_PER_NODE's
    first node, the chief's)."""
    if spec.nodes == 1 or "SLURM_STEP_TASKS_PER_NODE" not in os.environ:
        return spec.processes
    return slurm_tasks_per_node(os.environ["SLURM_STEP_TASKS_PER_NODE"])[0]

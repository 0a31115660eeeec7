"""TensorFlow ParameterServerStrategy (`tf-ps`) on the Keras loop (keras_loop.py): a chief,
`ps_tasks` parameter servers and `workers` workers, one process each, started by
`trainscale.launch.tfrun --ps` or by `srun` (tf_ps_cluster.py).

Training is asynchronous by design: the chief (the coordinator) runs tf-keras `model.fit` and
schedules each step on whichever worker is free; that worker reads the variables from the
servers, computes the gradient of its own batch and applies it there at once, without waiting
for any other worker. So the variables see `workers` times as many updates per epoch as under
the synchronous strategies, each of a per-worker batch (global / workers), computed from
variables that other workers may have moved meanwhile (stale gradients). An epoch covers the
same samples as every other strategy's: `steps` global batches are `steps × workers` worker
steps (`fit_steps`) of global / workers samples. The variables are partitioned over the
servers (`FixedShardsPartitioner`, `ps_tasks` shards along the first axis).

The servers and workers only serve (`tf.distribute.Server.join`, `Placement.trains` False)
until tfrun or srun stops them; the chief runs the loop. What differs from the other Keras
strategies is only what the chief cannot see: the workers' memory and device utilisation
(they run TensorFlow's server loop, no Python of ours: `memory` is the chief's), per-step times
and data wait (a step's result is fetched only when it is waited for, which would make the
training synchronous: `ScheduledEpochClock`, `step_seconds_p50/p95` null), and the loop's
scorer, whose variables in the strategy's scope would go to the servers (`evaluate`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.data import imagesets  # noqa: E402
from trainscale.measure import metrics  # noqa: E402
from trainscale.measure.memory import memory_block  # noqa: E402
from trainscale.models import keras_models  # noqa: E402
from trainscale.plan import catalog  # noqa: E402
from trainscale.plan.runspec import RunSpec  # noqa: E402
from trainscale.runners.tensorflow import keras_loop as loop  # noqa: E402
from trainscale.runners.tensorflow import keras_record  # noqa: E402
from trainscale.runners.tensorflow.keras_clock import ScheduledEpochClock  # noqa: E402
from trainscale.runners.tensorflow.keras_data import normaliser  # noqa: E402
from trainscale.runners.tensorflow.keras_input import resize  # noqa: E402
from trainscale.runners.tensorflow.tf_ps_cluster import (  # noqa: E402
    hide_or_pick_gpu,
    node_gpus,
    processes_on_this_node,
    serve,
    tf_config,
)

#: Beside every tf-ps result (env.note), so that no table reads it as synchronous training.
ASYNC_NOTE = (
    catalog.STRATEGIES["tf-ps"].results_note
    + "; an epoch's steps are worker steps (steps × workers); memory is the chief's"
)


class ParameterServer(loop.KerasStrategy):
    """`tf-ps`: the chief trains through a ClusterCoordinator; every other process serves."""

    framework_part = False  # no framework block (plan/faults.py refuses a fault there)

    def __init__(self, spec: RunSpec) -> None:
        super().__init__(spec)
        self.gpus = 0  # the node's GPUs: one per worker, none for the chief and the servers
        self.coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator | None = None

    def configure(self) -> loop.Placement:
        """The role from the cluster; a server or worker serves here until stopped."""
        config = tf_config(self.spec)
        self.gpus = node_gpus(self.spec)
        hide_or_pick_gpu(config, self.gpus)
        if config["task"]["type"] != "chief":
            serve(self.spec, config)  # returns only when stopped
            return loop.Placement(rank=config["task"]["index"], gpu=False, trains=False)
        tf.config.threading.set_intra_op_parallelism_threads(self.spec.threads_per_worker)
        tf.config.threading.set_inter_op_parallelism_threads(0)  # the default: see serve
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(config["cluster"]), task_type="chief", task_id=0, rpc_layer="grpc"
        )
        partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner
        self.strategy = tf.distribute.ParameterServerStrategy(
            resolver, variable_partitioner=partitioner(self.spec.ps_tasks)
        )
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        return loop.Placement(rank=0, gpu=False)  # the chief trains on no device of its own

    def train_dataset(self, arrays: data.Arrays, x: np.ndarray, steps: int, p: loop.Placement):
        """Each worker's own `pipeline`, built on the worker (dataset_fn)."""
        return keras.utils.experimental.DatasetCreator(dataset_fn(self.spec, arrays, x))

    def token_train(self, p: loop.Placement):
        raise RuntimeError("tf-ps trains on image arrays only (catalog rule ps_tokens)")

    def image_train(self, p: loop.Placement):
        raise RuntimeError(
            f"tf-ps trains on the built-in arrays only, not on the image files of "
            f"{self.spec.dataset}; use tf-multiworker or horovod-keras"
        )

    def fit_steps(self, steps: int) -> int:
        """Worker steps: each of a per-worker batch, so `steps` global batches' samples."""
        return steps * self.spec.world_size

    def epoch_clock(self, after_epoch, mid_epoch, steps: int) -> ScheduledEpochClock:
        return ScheduledEpochClock(self.coordinator, after_epoch, mid_epoch, steps)

    def input_clock(self, model) -> None:
        """None: a step takes its batch on its worker, where no Python of ours runs."""
        return None

    def evaluate(self, model, arrays: data.Arrays, x: np.ndarray, p: loop.Placement) -> dict:
        """The test set's scores on the chief (chief_evaluation) with the trained variables,
        read from the servers with their shards joined. In a thread of its own: fit holds the
        strategy's scope in this one (a scope is per thread), in which the local model's
        variables would go to the servers."""
        weights = joined_weights(model)
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(chief_evaluation, self.spec, weights, arrays, x).result()

    def measured(self, p: loop.Placement, gathered: list | None) -> keras_record.Measured:
        """The workers' devices counted, not measured (no utilisation, no energy); memory is
        the chief's, the one row gathered; the threads counted over the processes on the
        chief's node."""
        spec = self.spec
        memory = keras_record.memory_of(None, False)  # nulls where the gather failed
        if gathered is not None:
            memory = memory_block(gathered[0][0][:4], False)
        env = {"ps_tasks": spec.ps_tasks, "note": ASYNC_NOTE}
        if self.gpus:
            env["driver"] = metrics.driver_version()
        threads = spec.threads_per_worker * processes_on_this_node(spec)
        return keras_record.Measured(
            device={
                "kind": "cuda" if self.gpus else "cpu",
                "name": "GPU" if self.gpus else metrics.cpu_name(),
                "count": spec.world_size,
                "logical": False,
                "utilization_mean": None,
                "energy_joules": None,
            },
            memory=memory,
            env=env,
            gpu_name=None,
            oversubscribed=metrics.oversubscribed(1, threads, metrics.cpu_count()),
        )


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
        return resize(norm(tf.gather(images, idx)), spec.image_size), tf.gather(labels, idx)

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


# --- the chief: evaluation --------------------------------------------------------------------


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


def chief_evaluation(spec: RunSpec, weights: list, arrays: data.Arrays, x: np.ndarray) -> dict:
    """Accuracy, mean loss and confusion (rows true, columns predicted) of the test set, by a
    model outside the strategy with `weights`, on the chief."""
    shape = imagesets.spec_info(spec.to_dict()).shape
    local = keras_models.build(spec.model, shape, arrays.info.num_classes, spec.own_model)
    local.set_weights(weights)
    norm = normaliser(arrays)
    ds = tf.data.Dataset.from_tensor_slices(x).batch(spec.global_batch_size)
    logits = tf.cast(
        local.predict(ds.map(lambda a: resize(norm(a), spec.image_size)), verbose=0), tf.float32
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(arrays.test_y, logits)
    predicted = np.argmax(logits.numpy(), axis=1)
    classes = arrays.info.num_classes
    confusion = np.zeros((classes, classes), np.int64)
    np.add.at(confusion, (np.asarray(arrays.test_y), predicted), 1)
    accuracy = float(np.mean(predicted == arrays.test_y))
    return {"accuracy": accuracy, "loss": float(loss), "confusion": confusion.tolist()}


def main(spec: RunSpec, out: str) -> None:
    loop.run(ParameterServer(spec), out)

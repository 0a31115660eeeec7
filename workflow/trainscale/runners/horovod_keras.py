"""Horovod with Keras (`horovod-keras`): tf-keras `model.fit`, one process per worker, started
by `horovodrun`; gradients averaged by `hvd.DistributedOptimizer` (ring all-reduce over gloo
on CPU, NCCL on GPU), initial variables broadcast from rank 0 by Horovod's callback.

Keras 2 only (tf-keras, `TF_USE_LEGACY_KERAS=1`, set by the launcher): with Keras 3,
Horovod's `BroadcastGlobalVariablesCallback` raises, and without it the gradients are silently
*not* averaged (the ranks diverge) -- horovod/horovod#4290.

The rest is runners/tf.py's `tf` run per worker: the same arrays and normalisation, model,
optimizer, steps per epoch and thread budget. Every worker reads the same shuffled order of
global batches and trains on its share of each (as MultiWorkerMirroredStrategy does); test
scores are summed over the workers' strides of the test set with `hvd.allreduce`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import horovod  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data, keras_models, metrics  # noqa: E402
from trainscale.matrix import RunSpec  # noqa: E402
from trainscale.memory import memory_block  # noqa: E402
from trainscale.runners.common import (  # noqa: E402
    check_oversubscribed,
    check_steps,
    evaluates,
    fmt_rate,
    maybe_fault,
    steps_per_epoch,
)
from trainscale.runners.tf import (  # noqa: E402
    POLICIES,
    EpochClock,
    first_gpu_ordinal,
    make_optimizer,
    nhwc,
    normaliser,
    phase_peaks,
    pipeline_options,
)


def train_dataset(spec: RunSpec, arrays: data.Arrays, x: np.ndarray, steps: int) -> tf.data.Dataset:
    """This worker's share of every global batch: the training set replicated `scale` times,
    reshuffled each epoch with the run's seed (the same order on every worker), remainder
    dropped, the first `steps` global batches of each epoch's order, then rows
    [rank × b, (rank + 1) × b) of each global batch."""
    n, b, r = len(arrays.train_y), spec.per_worker_batch_size, hvd.rank()
    images, labels, norm = tf.constant(x), tf.constant(arrays.train_y), normaliser(arrays)

    def mine(idx):
        idx = idx[r * b : (r + 1) * b] % n
        return norm(tf.gather(images, idx)), tf.gather(labels, idx)

    return (
        tf.data.Dataset.range(n * spec.scale)
        .shuffle(n * spec.scale, seed=spec.seed, reshuffle_each_iteration=True)
        .batch(spec.global_batch_size, drop_remainder=True)
        .take(steps)
        .repeat()
        .map(mine)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(pipeline_options(spec))
    )


def test_scores(model, spec: RunSpec, arrays: data.Arrays, x: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean loss over the whole test set: each worker scores its stride in batches
    of its training batch, the sums are added over workers with hvd.allreduce."""
    rank, size, n = hvd.rank(), hvd.size(), len(arrays.test_y)
    norm = normaliser(arrays)
    ds = (
        tf.data.Dataset.from_tensor_slices((x[rank::size], arrays.test_y[rank::size]))
        .batch(spec.per_worker_batch_size)
        .map(lambda a, b: (norm(a), b))
        .with_options(pipeline_options(spec))
    )
    count = len(range(rank, n, size))
    res = model.evaluate(ds, verbose=0, return_dict=True) if count else {"accuracy": 0, "loss": 0}
    sums = tf.constant([res["accuracy"] * count, res["loss"] * count], tf.float64)
    total = hvd_tf.allreduce(sums, op=hvd_tf.Sum).numpy()
    return float(total[0] / n), float(total[1] / n)


def main(spec: RunSpec, out: str) -> None:
    rec = metrics.Recorder(spec.to_dict())
    # threads and devices first: they must be set before TensorFlow starts its runtime
    tf.config.threading.set_intra_op_parallelism_threads(spec.threads_per_worker)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        mine = gpus[hvd.local_rank()] if len(gpus) > hvd.local_rank() else gpus[0]
        tf.config.set_visible_devices(mine, "GPU")
        tf.config.experimental.set_memory_growth(mine, True)
    if hvd.size() != spec.world_size:
        raise RuntimeError(
            f"horovodrun started {hvd.size()} workers, the run needs {spec.world_size}"
        )
    chief = hvd.rank() == 0
    keras.mixed_precision.set_global_policy(POLICIES[spec.precision])
    keras.utils.set_random_seed(spec.seed)  # same fresh initial weights on every worker, repeat

    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
    train_x, test_x = nhwc(arrays.train_x), nhwc(arrays.test_x)
    train_samples = len(arrays.train_y) * spec.scale
    steps = steps_per_epoch(
        train_samples, spec.world_size, spec.per_worker_batch_size, spec.steps_per_epoch
    )
    check_steps(steps, spec.path, train_samples, spec.global_batch_size)

    model = keras_models.build(spec.model, arrays.info.shape, arrays.info.num_classes)
    model.compile(
        optimizer=hvd.DistributedOptimizer(make_optimizer(spec)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )

    synthetic = arrays.info.synthetic
    test = {"accuracy": None, "loss": None}
    memory = phase_peaks(bool(gpus), 1)

    def after_epoch(epoch: int, seconds: float, step_seconds: list[float], logs: dict) -> None:
        # the mean over workers (Horovod's MetricAverageCallback would do it, but in 0.28.1 it
        # calls Keras 3's backend, which has no `constant`, even when tf-keras trains)
        loss = tf.constant(float(logs["loss"]), tf.float64)
        train_loss = float(hvd_tf.allreduce(loss, op=hvd_tf.Average).numpy())
        scored = evaluates(spec, synthetic, epoch)
        if scored:  # collective: every worker scores its stride
            memory.evaluation_starts()
            acc, loss = test_scores(model, spec, arrays, test_x)
            memory.evaluation_ends()
            test.update(accuracy=acc, loss=loss)
        e = rec.epoch(
            seconds,
            samples=steps * spec.global_batch_size,
            steps=steps,
            train_loss=train_loss,
            step_seconds=step_seconds,
            test_accuracy=test["accuracy"] if scored else None,
            test_loss=test["loss"] if scored else None,
        )
        if chief:
            print(
                f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, "
                f"{fmt_rate(e['samples_per_second'])} samples/s, loss {train_loss:.4f}",
                flush=True,
            )

    gpu = metrics.GpuMonitor(
        read=metrics.GpuMonitor.nvml_reader(first_gpu_ordinal()) if gpus else None
    )
    rec.training_starts()
    gpu.start()
    model.fit(
        train_dataset(spec, arrays, train_x, steps),
        epochs=spec.epochs,
        steps_per_epoch=steps,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            EpochClock(after_epoch, lambda e: maybe_fault(spec, hvd.rank(), e), steps),
        ],
        verbose=0,
    )
    utilization, energy = gpu.stop()

    # Peak memory: max over workers; energy summed, utilisation averaged; every worker's host.
    peaks = hvd_tf.allreduce(tf.constant(memory.finish(), tf.float64), op=hvd_tf.Max).numpy()
    sums = hvd_tf.allreduce(
        tf.constant([energy or 0.0, utilization or 0.0], tf.float64), op=hvd_tf.Sum
    ).numpy()
    hosts = hvd_tf.allgather_object(metrics.hostname())
    save = os.environ.get("TRAINSCALE_SAVE_WEIGHTS")  # final weights, for equivalence tests
    if save and "{rank}" in save:  # every worker's, to check that they agree
        np.savez(save.format(rank=hvd.rank(), strategy=spec.strategy), *model.get_weights())
    if not chief:
        return
    env = metrics.environment(
        rec.start_utc,
        {
            "tensorflow": tf.__version__,
            "tf-keras": keras.__version__,
            "horovod": horovod.__version__,
        },
        hosts,
    )
    if gpus:
        env["cuda"] = tf.sysconfig.get_build_info().get("cuda_version")
        env["driver"] = metrics.driver_version()
        details = tf.config.experimental.get_device_details(tf.config.get_visible_devices("GPU")[0])
        name = details.get("device_name", "GPU")
    else:
        name = metrics.cpu_name()
    result = rec.record(
        model={"params": keras_models.param_count(model)},
        data={"train_samples": train_samples, "test_samples": len(arrays.test_y)},
        test=test,
        memory=memory_block(peaks.tolist(), bool(gpus)),
        device={
            "kind": "cuda" if gpus else "cpu",
            "name": name,
            "count": hvd.size(),
            "utilization_mean": float(sums[1]) / hvd.size() if gpus else None,
            "energy_joules": float(sums[0]) if gpus and energy is not None else None,
        },
        env=env,
        oversubscribed=check_oversubscribed(spec.workers, spec.threads_per_worker),
        launch=metrics.launch_info(),
        horovod={"timeline": os.environ.get("HOROVOD_TIMELINE"), "final_world_size": hvd.size()},
    )
    metrics.write(out, result)
    if save and "{rank}" not in save:
        np.savez(save, *model.get_weights())
    print(
        f"trainscale: ok, throughput {fmt_rate(result['throughput'])} samples/s, "
        f"test accuracy {test['accuracy'] if not synthetic else 'n/a'}; wrote {out}",
        flush=True,
    )

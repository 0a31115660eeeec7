"""One Keras training loop for every TensorFlow strategy (`tf`, `tf-mirrored`, `tf-multiworker`,
`tf-ps`, `horovod-keras`, `horovod-keras-elastic`); each strategy is a small plug-in
(`KerasStrategy`, keras_strategy.py).

The loop owns what every strategy does alike, so that every run of the family records the same
figures the same way: the thread budget and seeds, the data (keras_data.py; on token data the
windows torch's ranks read, keras_tokens.py), the model and optimizer, the timed epochs of Keras
`model.fit` (keras_clock.py), the injected fault, the divergence check, the evaluation
schedule, the per-rank memory / utilisation / energy gather and the metrics record
(keras_record.py). A plug-in says only what differs: where its process sits and which devices
it uses (`configure`), the scope the model is built in, how the optimizer is wrapped, which
share of each global batch this process feeds, its clock and fit steps, its extra callbacks,
how figures are combined over workers, how the test set is scored, its extra record blocks,
and its teardown.

Every strategy uses tf-keras 2 (`TF_USE_LEGACY_KERAS=1`): Keras 3's `model.fit` fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585) and Horovod's Keras integration needs
Keras 2, so one Keras serves every TensorFlow strategy alike.

Horovod elastic (horovod_keras.py) is such a plug-in: its `fit` runs model.fit inside
`hvd.elastic.run` and commits the loop's record with the model, `final_rank` says who writes
after the world re-formed, `extra_metrics` adds the membership. So is ParameterServerStrategy
(tf_ps.py): its servers and workers only serve (`Placement.trains` False), the chief runs this
loop on a DatasetCreator with a clock of scheduled steps.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import dataclasses  # noqa: E402
import functools  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.data import imagesets  # noqa: E402
from trainscale.measure import datawait, divergence, metrics  # noqa: E402
from trainscale.measure.device_usage import CpuUsage  # noqa: E402
from trainscale.measure.memory import PhasePeaks  # noqa: E402
from trainscale.models import keras_models  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402
from trainscale.runners.common import (  # noqa: E402
    check_steps,
    evaluates,
    maybe_fault,
    record_epoch,
    steps_per_epoch,
    write_ok,
)
from trainscale.runners.device_check import process_rank, require_gpu  # noqa: E402
from trainscale.runners.guarded import Parts  # noqa: E402
from trainscale.runners.tensorflow import keras_tokens  # noqa: E402
from trainscale.runners.tensorflow.keras_data import nhwc  # noqa: E402
from trainscale.runners.tensorflow.keras_input import TimedTrainFunction  # noqa: E402
from trainscale.runners.tensorflow.keras_record import record  # noqa: E402
from trainscale.runners.tensorflow.keras_strategy import KerasStrategy, Placement  # noqa: E402

SPLITS = ("train", "test")
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def physical_gpus(spec: RunSpec) -> list:
    """The GPUs TensorFlow sees in this process; on `accelerator` cuda, none stops the run
    with why (a CPU build, no device, libraries missing: runners.device_check)."""
    gpus = tf.config.list_physical_devices("GPU")
    build = tf.sysconfig.get_build_info()
    cuda = build.get("cuda_version") if build.get("is_cuda_build") else None
    require_gpu(spec.accelerator, f"TensorFlow {tf.__version__}", len(gpus), cuda, process_rank())
    return gpus


def visible_gpus(gpus: list, local_rank: int, count: int, strategy: str) -> list:
    """This process's `count` GPUs: its node-local share where it sees the node's GPUs, all it
    sees where the scheduler already gave it its own; made visible, memory grown as needed (so
    the peak is what the run used)."""
    if len(gpus) >= local_rank + count:
        mine = gpus[local_rank : local_rank + count]
    elif len(gpus) == count:
        mine = gpus
    else:
        raise RuntimeError(
            f"{strategy}: this process (local rank {local_rank}) needs {count} GPU(s) of its "
            f"own and sees {len(gpus)}"
        )
    tf.config.set_visible_devices(mine, "GPU")
    for g in mine:
        tf.config.experimental.set_memory_growth(g, True)
    return mine


def set_threads(spec: RunSpec, replicas: int) -> None:
    """`threads_per_worker` threads per worker: intra-op threads = replicas in this process ×
    threads_per_worker, inter-op threads = replicas (one op at a time per worker, as a PyTorch
    process runs them)."""
    tf.config.threading.set_intra_op_parallelism_threads(replicas * spec.threads_per_worker)
    tf.config.threading.set_inter_op_parallelism_threads(replicas)


def make_optimizer(spec: RunSpec) -> keras.optimizers.Optimizer:
    """torch.optim.Adam / AdamW / SGD with the spec's hyper-parameters.

    AdamW's decoupled decay is Keras' AdamW `weight_decay` (both shrink the weights by
    lr · weight_decay each step, apart from the gradient). PyTorch's Adam and SGD weight_decay
    is an L2 term added to the gradient (not the decoupled decay that Keras' `weight_decay`
    means), so it is added here, after the gradients of all replicas are aggregated. Keras'
    Adam applies epsilon to sqrt(v) before bias correction (Kingma & Ba's "epsilon hat");
    with eps = 1e-7 the two forms differ below float32 noise.
    """
    wd = spec.weight_decay
    if spec.optimizer == "adamw":
        return keras.optimizers.AdamW(
            learning_rate=spec.lr, weight_decay=wd, beta_1=spec.betas[0], beta_2=spec.betas[1],
            epsilon=spec.eps,
        )  # fmt: skip
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


def first_gpu_ordinal() -> int:
    """CUDA ordinal of the first GPU this process trains on (its index among the physical GPUs,
    which TensorFlow numbers as CUDA does), for NVML: not the worker's rank, which differs
    where the scheduler gave each process its own GPU."""
    return tf.config.list_physical_devices("GPU").index(tf.config.get_visible_devices("GPU")[0])


def build_model(plugin: KerasStrategy, info: data.DatasetInfo):
    """The run's network, compiled with the run's optimizer (as the plug-in wraps it), built in
    the plug-in's scope (after `run` set the seed: the same initial weights on every worker)."""
    spec = plugin.spec
    with plugin.scope():
        model = keras_models.build(spec.model, info.shape, info.num_classes, spec.own_model)
        model.compile(
            optimizer=plugin.wrap_optimizer(make_optimizer(spec)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    return model


def nan_for_none(row: list[float | None]) -> list[float]:
    """A row of figures as floats for a collective (float64 carries byte counts exactly)."""
    return [np.nan if v is None else float(v) for v in row]


def none_for_nan(row) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in row]


def every_worker(plugin: KerasStrategy, rank: int, error: str | None) -> list[str | None]:
    """Every worker's outcome of a part (runners.guarded.Parts' agreement), in rank order,
    through the plug-in's all-gather: another worker's error as a flag (its text is in its
    own log)."""
    flags = [row[0] for row, _ in plugin.gather([float(error is not None)], metrics.hostname())]
    return [(error if r == rank else "an error in that worker's log") if flag else None
            for r, flag in enumerate(flags)]  # fmt: skip


@dataclass(frozen=True)
class TrainInput:
    """What `model.fit` reads, and what the record counts of it."""

    info: data.DatasetInfo  # the classes and the input shape the model is built for
    dataset: object  # what model.fit reads (a tf.data.Dataset; tf-ps: a DatasetCreator)
    steps: int  # global batches an epoch
    train_samples: int
    test_samples: int
    arrays: data.Arrays | None = None  # a built-in's arrays (None: tokens, the user's images)
    test_x: np.ndarray | None = None  # their test images, NHWC


def train_input(plugin: KerasStrategy, p: Placement) -> TrainInput:
    """The run's data as `plugin` feeds this process: token windows (keras_tokens.py, the
    vocabulary as the classes), a built-in's arrays, or the user's images decoded while
    training (trainscale.data.imagedata_tf)."""
    spec = plugin.spec
    if spec.seq_len:
        feed = plugin.token_train(p)
        check_steps(feed.steps, spec.path, feed.count, spec.global_batch_size)
        test_samples = keras_tokens.eval_windows(spec).windows
        dataset = feed.dataset(spec, p.replicas)
        info = imagesets.spec_info(spec.to_dict())
        return TrainInput(info, dataset, feed.steps, feed.count, test_samples)
    if spec.image_source is not None:
        info = imagesets.spec_info(spec.to_dict())
        train_samples, test_samples = (imagesets.count(spec.image_source, s) for s in SPLITS)
        dataset, steps = plugin.image_train(p)
        return TrainInput(info, dataset, steps, train_samples, test_samples)
    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
    info = dataclasses.replace(arrays.info, shape=imagesets.spec_info(spec.to_dict()).shape)
    train_x, test_x = nhwc(arrays.train_x), nhwc(arrays.test_x)
    train_samples = len(arrays.train_y) * spec.scale
    steps = steps_per_epoch(
        train_samples, spec.world_size, spec.per_worker_batch_size, spec.steps_per_epoch
    )
    check_steps(steps, spec.path, train_samples, spec.global_batch_size)
    dataset = plugin.train_dataset(arrays, train_x, steps, p)
    return TrainInput(info, dataset, steps, train_samples, len(arrays.test_y), arrays, test_x)


@dataclass(frozen=True)
class EpochEnd:
    """What the loop does when an epoch's clock stopped (the clock's `after_epoch`): the data
    wait, the divergence check, the evaluation and the epoch's record."""

    plugin: KerasStrategy
    p: Placement
    rec: metrics.Recorder
    model: keras.Model
    feed: TrainInput
    waits: TimedTrainFunction | None  # the data wait's clock; None: not measured
    memory: PhasePeaks
    parts: Parts
    test: dict  # the latest test scores, updated in place (the record's `test`)
    fit_steps: int  # model.fit's steps an epoch (plugin.fit_steps)
    per_step_losses: bool  # the clock knows each step's loss (else the epoch's mean only)

    def __call__(
        self, epoch: int, seconds: float, step_seconds: list[float], logs: dict, losses: list
    ) -> None:
        spec, rank = self.plugin.spec, self.p.rank
        waited = None
        if self.waits is not None:
            wait = self.waits.take()
            waited = (wait, [r[0] for r, _ in self.plugin.gather([wait], metrics.hostname())])
        train_loss = self.plugin.mean_over_workers(float(logs["loss"]))
        if self.diverged(epoch, losses):
            self.model.stop_training = True  # after this epoch, on every worker alike
            if rank == 0:
                message = self.rec.losses.diverged.message()
                print(f"epoch {epoch}/{spec.epochs}: {message}", flush=True)
            return  # not recorded: its figures are of steps that trained nothing
        scored = self.evaluation(epoch)
        steps = self.feed.steps
        e = record_epoch(
            self.rec, spec, epoch, seconds, steps, train_loss, step_seconds, scored, rank == 0
        )
        e["steps"] = self.fit_steps  # the samples stay those of `feed.steps` global batches
        if waited is not None:
            e.update(datawait.epoch_fields(*waited))

    def diverged(self, epoch: int, losses: list[float]) -> bool:
        """Whether any worker's loss went unsound in this epoch (trainscale.measure.divergence):
        decided alike on every worker, which each log their own loss under Horovod."""
        watch = self.rec.losses
        here = watch.first_unsound(losses) is not None
        if self.plugin.mean_over_workers(float(here)) == 0:
            watch.epoch(epoch, losses)  # sound: the run's first and last losses go on
            return False
        if self.per_step_losses:
            watch.epoch(epoch, losses, elsewhere=True)
        else:  # only the epoch's mean loss is known: put at the epoch's last step
            watch.diverged = divergence.Divergence(epoch, self.fit_steps, losses[-1], watch.last)
        return True

    def evaluation(self, epoch: int) -> tuple[float | None, float | None] | None:
        """(accuracy, loss) of the test set where this epoch is scored (common.evaluates),
        every worker taking part (under the strategies evaluation is collective); None where
        it is not, or the part failed (runners.guarded)."""
        spec = self.plugin.spec
        if not evaluates(spec, self.feed.info.synthetic, epoch) or self.parts.failed("evaluation"):
            return None
        scored = self.parts.run("evaluation", self.scores, epoch=epoch)
        self.test.clear()
        self.test.update(scored or {"accuracy": None, "loss": None})
        return (self.test["accuracy"], self.test["loss"]) if scored is not None else None

    def scores(self) -> dict:
        self.memory.evaluation_starts()
        try:
            return self.plugin.evaluate(self.model, self.feed.arrays, self.feed.test_x, self.p)
        finally:
            self.memory.evaluation_ends()


def train(
    plugin: KerasStrategy, p: Placement, model, end: EpochEnd, clock, rec: metrics.Recorder
) -> tuple[float | None, float | None]:
    """All epochs; (utilisation, energy) of this worker's devices meanwhile: NVML's on GPUs,
    else the busy share of its CPU cores and RAPL energy (trainscale.measure.device_usage),
    read by one process per host."""
    spec = plugin.spec
    gpu = metrics.GpuMonitor(
        read=metrics.GpuMonitor.nvml_reader(first_gpu_ordinal()) if p.gpu else None
    )
    cpu = CpuUsage(p.replicas * spec.threads_per_worker, int(os.environ.get("LOCAL_RANK", 0)) == 0)
    rec.training_starts()
    gpu.start()
    cpu.span_starts()
    plugin.fit(model, end.feed.dataset, end.fit_steps, [*plugin.callbacks(), clock], rec, end.test)
    cpu.span_ends()
    utilization, energy = gpu.stop()
    return (utilization, energy) if p.gpu else cpu.result()


def run(plugin: KerasStrategy, out: str) -> None:
    """Train the run spec's model with `plugin`'s strategy; rank 0 writes the record to `out`."""
    spec = plugin.spec
    rec = metrics.Recorder(spec.to_dict())
    p = plugin.configure()
    if not p.trains:
        plugin.teardown()
        return
    rec.timeline.ends("rendezvous")  # the set-up's phases, for the record's timeline
    keras.mixed_precision.set_global_policy(POLICIES[spec.precision])
    keras.utils.set_random_seed(spec.seed)  # same fresh initial weights on every worker, repeat
    feed = train_input(plugin, p)
    rec.timeline.ends("data")
    model = build_model(plugin, feed.info)
    waits = plugin.input_clock(model)
    rec.timeline.ends("model")

    test: dict[str, float | None] = {"accuracy": None, "loss": None}
    memory = phase_peaks(p.gpu, p.replicas)
    # evaluation and the measurements after training: each may fail, the run goes on
    parts = Parts(spec, rec.warnings, lambda e: every_worker(plugin, p.rank, e), rec.timeline)
    fit_steps = plugin.fit_steps(feed.steps)
    fault = functools.partial(maybe_fault, spec, p.rank)  # before the middle step
    clock = plugin.epoch_clock(lambda *a: end(*a), fault, fit_steps)  # `end` is made next
    end = EpochEnd(
        plugin, p, rec, model, feed, waits, memory, parts, test, fit_steps, clock.per_step_losses
    )
    utilization, energy = train(plugin, p, model, end, clock, rec)

    # every worker process's peaks, utilisation, energy and host, on rank 0 in rank order
    gathered = parts.run(
        "memory",
        lambda: plugin.gather(
            [*memory.finish(), utilization, energy, metrics.cpu_count()], metrics.hostname()
        ),
    )
    extra = {}
    if plugin.framework_part:
        extra = parts.run("framework", plugin.extra_metrics, collective=False) or {}
    if plugin.final_rank(p) == 0:
        counts = (feed.info, out, feed.train_samples, feed.test_samples)
        result = record(plugin, p, rec, model, gathered, test, counts, parts, extra)
        write_ok(out, result, test["accuracy"] if not feed.info.synthetic else "n/a")
    plugin.teardown()

"""One Keras training loop for every TensorFlow strategy (`tf`, `tf-mirrored`, `tf-multiworker`,
`horovod-keras`, `horovod-keras-elastic`); each strategy is a small plug-in (`KerasStrategy`).

The loop owns what every strategy does alike, so that every run of the family records the same
figures the same way: the thread budget and seeds, the data (keras_data.py; on token data the
windows torch's ranks read, keras_tokens.py), the model and optimizer, the barrier-timed
epochs of Keras `model.fit` (`EpochClock`), the injected fault, the evaluation schedule, the
per-rank memory / utilisation / energy gather and the metrics record (keras_record.py). A
plug-in says only what differs: where its process sits and which devices it uses
(`configure`), the scope the model is built in, how the optimizer is wrapped, which share of
each global batch this process feeds, its extra callbacks, how figures are combined over
workers, how the test set is scored, its extra record blocks, and its teardown.

Every strategy uses tf-keras 2 (`TF_USE_LEGACY_KERAS=1`): Keras 3's `model.fit` fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585) and Horovod's Keras integration needs
Keras 2, so one Keras serves every TensorFlow strategy alike.

Horovod elastic (horovod_keras.py) is such a plug-in: its `fit` runs model.fit inside
`hvd.elastic.run` and commits the loop's record with the model, `final_rank` says who writes
after the world re-formed, `extra_metrics` adds the membership. Also built to carry:
ParameterServerStrategy with model.fit (`configure` starts the servers of non-coordinator
processes and returns a `Placement` with `trains=False`; `train_dataset` returns a
DatasetCreator).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402
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
from trainscale.runners.tensorflow.keras_data import (  # noqa: E402
    eval_dataset,
    nhwc,
    train_dataset,
)
from trainscale.runners.tensorflow.keras_eval import (  # noqa: E402
    scorer,
    scores_of,
    token_scores_of,
)
from trainscale.runners.tensorflow.keras_input import (  # noqa: E402
    TimedTrainFunction,
    image_test,
    image_train,
)
from trainscale.runners.tensorflow.keras_record import record  # noqa: E402

SPLITS = ("train", "test")
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


@dataclass(frozen=True)
class Placement:
    """Where this process sits and what it trains on, as its plug-in's `configure` set it up."""

    rank: int  # this process's worker index (task id, Horovod rank); 0 writes the metrics
    gpu: bool  # trains on GPUs (else on CPU)
    replicas: int = 1  # workers (model replicas) in this process: >1 for tf-mirrored only
    logical: bool = False  # the replicas are logical devices carved out of one CPU
    trains: bool = True  # False: a process that only serves (a parameter server), no loop


class KerasStrategy:
    """A strategy on the Keras loop. The defaults are one process training on what it sees."""

    #: frameworks besides TensorFlow and tf-keras whose versions go into `env.frameworks`
    frameworks: dict[str, str] = {}

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        #: the tf.distribute strategy `configure` made, if any (not before: making one starts
        #: TensorFlow's runtime, after which threads and devices can no longer be set)
        self.strategy: tf.distribute.Strategy | None = None
        self._test_data: tf.data.Dataset | None = None
        self._scorer: keras.Model | None = None

    def configure(self) -> Placement:
        """Threads, visible devices and the tf.distribute strategy; runs before TensorFlow
        starts its runtime."""
        raise NotImplementedError

    def scope(self) -> contextlib.AbstractContextManager:
        """Where the model and optimizer are built (their variables placed)."""
        return self.strategy.scope() if self.strategy else contextlib.nullcontext()

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        return optimizer

    def train_dataset(self, arrays: data.Arrays, x: np.ndarray, steps: int, p: Placement):
        """What `model.fit` reads: global batches, which the strategy splits over replicas."""
        return train_dataset(self.spec, arrays, x, steps, p.replicas)

    def token_train(self, p: Placement) -> keras_tokens.TokenTrain:
        """The token windows `model.fit` reads: every rank's batch of each step, stacked in
        rank order into the global batch, which the strategy splits (keras_tokens.py)."""
        b = self.spec.per_worker_batch_size
        return keras_tokens.TokenTrain(
            self.spec, range(self.spec.world_size), self.spec.world_size, b
        )

    def callbacks(self) -> list[keras.callbacks.Callback]:
        """Callbacks that run before the loop's clock in every step (Horovod's broadcast)."""
        return []

    def mean_over_workers(self, value: float) -> float:
        """A per-worker figure averaged over workers (Keras' logs already are, under a
        tf.distribute strategy)."""
        return value

    def image_train(self, p: Placement) -> tuple[tf.data.Dataset, int]:
        """What `model.fit` reads from the user's images, and the steps of an epoch: global
        batches, read whole by this process (keras_input.image_train)."""
        return image_train(self.spec, self.spec.global_batch_size)

    def evaluate(self, model, arrays: data.Arrays | None, x: np.ndarray | None, p: Placement):
        """The `test` block's accuracy, mean loss and confusion over the whole test set
        (keras_eval.py); collective under a strategy, each replica scoring its share of
        batches of the global batch. On the user's images (`arrays` None) each process reads
        the whole test split (keras_input.image_test). On token data (`seq_len`) next-token
        accuracy, loss and perplexity over the test windows in global batches."""
        if self.spec.seq_len:
            if self._test_data is None:
                self._test_data = keras_tokens.eval_dataset(
                    self.spec, self.spec.global_batch_size, p.replicas
                )
            return token_scores_of(self.scorer(model, 0, tokens=True), self._test_data)
        if self._test_data is None and arrays is None:
            self._test_data = image_test(self.spec, self.spec.per_worker_batch_size * p.replicas)
        if self._test_data is None:  # built once, at the first evaluation
            self._test_data = eval_dataset(
                self.spec, arrays, x, arrays.test_y, self.spec.global_batch_size, p.replicas
            )
        classes = imagesets.spec_info(self.spec.to_dict()).num_classes
        return scores_of(self.scorer(model, classes), self._test_data, classes)

    def scorer(self, model, classes: int, tokens: bool = False) -> keras.Model:
        """`model`'s scoring model (keras_eval.scorer), built once, in the plug-in's scope."""
        if self._scorer is None:
            with self.scope():
                self._scorer = scorer(model, classes, tokens)
        return self._scorer

    def gather(self, row: list[float | None], host: str) -> list[tuple[list[float | None], str]]:
        """Every worker process's `row` and host name, in rank order (all of them on rank 0)."""
        return [(row, host)]

    def fit(self, model, dataset, steps: int, callbacks: list, rec, test: dict) -> None:
        """All epochs. `rec` (the metrics.Recorder holding the epochs so far) and `test` (the
        latest test scores) are the loop's record of training, which Horovod elastic commits
        and restores with the model (it runs this inside `hvd.elastic.run`)."""
        model.fit(
            dataset,
            epochs=self.spec.epochs,
            steps_per_epoch=steps,
            callbacks=callbacks,
            verbose=0,
        )

    def final_rank(self, p: Placement) -> int:
        """This process's rank after training (rank 0 writes the record): the placement's,
        unless the world re-formed on the way (Horovod elastic renumbers the workers)."""
        return p.rank

    def extra_metrics(self) -> dict:
        """Record blocks only this strategy writes (e.g. `horovod`)."""
        return {}

    def teardown(self) -> None:
        """After the record is written (or on a worker that writes none)."""


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


class EpochClock(keras.callbacks.Callback):
    """Wall-clock (`time.perf_counter`) seconds of each epoch's training steps and of each step.

    Keras converts a step's logs to numpy before `on_train_batch_end` for a callback like this
    one (no `_supports_tf_logs`), which waits for the step to finish; under the strategies every
    step ends in an all-reduce, so the epoch's end is synchronised across replicas and workers.
    `mid_epoch(epoch)` runs before the middle step (the fault hook); `after_epoch(epoch,
    seconds, step_seconds, logs, losses)` runs after the clock stops, `losses` the loss Keras
    logged after each step (its running mean over the epoch, already on the host).
    """

    def __init__(self, after_epoch, mid_epoch=None, steps: int = 0) -> None:
        super().__init__()
        self.after_epoch = after_epoch
        self.mid_epoch, self.half = mid_epoch, steps // 2
        self._epoch = 0
        self._t_epoch = self._t_step = 0.0
        self._steps: list[float] = []
        self._losses: list[float] = []

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = epoch + 1
        self._steps, self._losses = [], []
        self._t_epoch = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        if self.mid_epoch and batch == self.half:
            self.mid_epoch(self._epoch)
        self._t_step = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self._steps.append(time.perf_counter() - self._t_step)
        self._losses.append(float((logs or {}).get("loss", np.nan)))

    def on_epoch_end(self, epoch, logs=None) -> None:
        seconds = time.perf_counter() - self._t_epoch
        self.after_epoch(epoch + 1, seconds, self._steps, dict(logs or {}), self._losses)


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

    arrays = train_x = test_x = None
    if spec.seq_len:  # token windows (keras_tokens.py), the vocabulary as the classes
        info = imagesets.spec_info(spec.to_dict())
        feed = plugin.token_train(p)
        steps, train_samples = feed.steps, feed.count
        test_samples = keras_tokens.eval_windows(spec).windows
        check_steps(steps, spec.path, train_samples, spec.global_batch_size)
        dataset = feed.dataset(spec, p.replicas)
    elif spec.image_source is None:
        arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
        info = dataclasses.replace(arrays.info, shape=imagesets.spec_info(spec.to_dict()).shape)
        train_x, test_x = nhwc(arrays.train_x), nhwc(arrays.test_x)
        train_samples, test_samples = len(arrays.train_y) * spec.scale, len(arrays.test_y)
        steps = steps_per_epoch(
            train_samples, spec.world_size, spec.per_worker_batch_size, spec.steps_per_epoch
        )
        check_steps(steps, spec.path, train_samples, spec.global_batch_size)
        dataset = plugin.train_dataset(arrays, train_x, steps, p)
    else:  # the user's images, decoded while training (trainscale.data.imagedata_tf)
        info = imagesets.spec_info(spec.to_dict())
        train_samples, test_samples = (imagesets.count(spec.image_source, s) for s in SPLITS)
        dataset, steps = plugin.image_train(p)
    rec.timeline.ends("data")
    model = build_model(plugin, info)
    waits = TimedTrainFunction.install(model)
    rec.timeline.ends("model")

    synthetic = info.synthetic
    test: dict[str, float | None] = {"accuracy": None, "loss": None}
    memory = phase_peaks(p.gpu, p.replicas)
    # evaluation and the measurements after training: each may fail, the run goes on
    parts = Parts(spec, rec.warnings, lambda e: every_worker(plugin, p.rank, e), rec.timeline)

    def scores() -> dict:
        memory.evaluation_starts()
        try:
            return plugin.evaluate(model, arrays, test_x, p)
        finally:
            memory.evaluation_ends()

    def after_epoch(
        epoch: int, seconds: float, step_seconds: list[float], logs: dict, logged: list[float]
    ) -> None:
        wait = waits.take()
        ranks = [r[0] for r, _ in plugin.gather([wait], metrics.hostname())]
        train_loss = plugin.mean_over_workers(float(logs["loss"]))
        if diverged(epoch, divergence.step_losses(logged)):
            model.stop_training = True  # after this epoch, on every worker alike
            if p.rank == 0:
                print(f"epoch {epoch}/{spec.epochs}: {rec.losses.diverged.message()}", flush=True)
            return  # not recorded: its figures are of steps that trained nothing
        scored = None
        if evaluates(spec, synthetic, epoch) and not parts.failed("evaluation"):
            # every worker evaluates: under the strategies evaluation is collective
            scored_now = parts.run("evaluation", scores, epoch=epoch)
            test.clear()
            test.update(scored_now or {"accuracy": None, "loss": None})
            scored = (test["accuracy"], test["loss"]) if scored_now is not None else None
        e = record_epoch(
            rec, spec, epoch, seconds, steps, train_loss, step_seconds, scored, p.rank == 0
        )
        e.update(datawait.epoch_fields(wait, ranks))

    def diverged(epoch: int, losses: list[float]) -> bool:
        """Whether any worker's loss went unsound in this epoch (trainscale.measure.divergence):
        decided alike on every worker, which each log their own loss under Horovod."""
        here = rec.losses.first_unsound(losses) is not None
        if plugin.mean_over_workers(float(here)) == 0:
            return False
        rec.losses.epoch(epoch, losses, elsewhere=True)
        return True

    clock = EpochClock(after_epoch, lambda e: maybe_fault(spec, p.rank, e), steps)
    gpu = metrics.GpuMonitor(
        read=metrics.GpuMonitor.nvml_reader(first_gpu_ordinal()) if p.gpu else None
    )
    # no NVML: the worker's busy share of its CPU cores and RAPL energy
    # (trainscale.measure.device_usage), read by one process per host
    cpu = CpuUsage(p.replicas * spec.threads_per_worker, int(os.environ.get("LOCAL_RANK", 0)) == 0)
    rec.training_starts()
    gpu.start()
    cpu.span_starts()
    plugin.fit(model, dataset, steps, [*plugin.callbacks(), clock], rec, test)
    cpu.span_ends()
    utilization, energy = gpu.stop()
    if not p.gpu:
        utilization, energy = cpu.result()

    # every worker process's peaks, utilisation, energy and host, on rank 0 in rank order
    gathered = parts.run(
        "memory",
        lambda: plugin.gather(
            [*memory.finish(), utilization, energy, metrics.cpu_count()], metrics.hostname()
        ),
    )
    extra = parts.run("framework", plugin.extra_metrics, collective=False) or {}
    if plugin.final_rank(p) == 0:
        counts = (info, out, train_samples, test_samples)
        result = record(plugin, p, rec, model, gathered, test, counts, parts, extra)
        write_ok(out, result, test["accuracy"] if not synthetic else "n/a")
    plugin.teardown()

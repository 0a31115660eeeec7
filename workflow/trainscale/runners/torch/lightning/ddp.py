"""`lightning-ddp`: PyTorch Lightning's `Trainer(strategy="ddp")`, launched by torchrun.

Lightning reads torchrun's environment (its TorchElastic cluster environment), so it starts no
processes of its own: each rank builds the Trainer with `devices=workers, num_nodes=nodes` and
Lightning checks them against torchrun's world. What it trains is exactly `torch-ddp`'s run:

- the same model (`trainscale.models.torch_models.build`, seeded the same), data tensors and
  optimizer;
- the same data order: `torch-ddp`'s DistributedSampler (same seed, epochs numbered from 1)
  cut into per-worker batches here, so Lightning's own sampler injection is off; on token
  data (a GPT) the torch loop's own token loader, so every rank reads the loop's windows in
  the loop's order (data.py);
- the same steps per epoch and global batch; the loss as `torch-ddp` computes it
  (torch_parts.loss_of: class or next-token cross-entropy), and the test set scored as it
  scores it (next-token accuracy, loss and perplexity on token data; token ids stay int64).

Lightning owns the loop; a Callback times it as the torch runners do: a barrier at every
epoch's start and end (device synchronised), rank 0's per-step wall times, the fault hook half
way through the epoch, the test set scored after the epoch outside the timed span. The record
is built from the same parts as `torch-ddp`'s (metrics.Recorder, ranks_memory, environment).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator

import lightning
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader

from trainscale import data
from trainscale.data import imagesets, tokendata
from trainscale.measure import datawait, metrics
from trainscale.measure.device_usage import energy_once_per_device
from trainscale.measure.memory import PhasePeaks, ranks_memory
from trainscale.models import torch_models as models
from trainscale.plan.matrix import RunSpec
from trainscale.runners.common import (
    check_oversubscribed,
    check_steps,
    detect_rank,
    evaluates,
    fmt_rate,
    maybe_fault,
    steps_per_epoch,
    write_ok,
)
from trainscale.runners.guarded import Parts
from trainscale.runners.torch import checkpointing, flop_count
from trainscale.runners.torch.exposed import block
from trainscale.runners.torch.lightning.data import (
    InMemory,
    MicroBatches,
    ShardBatches,
    SizedWait,
    WindowEpochs,
)
from trainscale.runners.torch.step_timer import StepTimer
from trainscale.runners.torch.torch_parts import (
    evaluate,
    group_backend,
    leave,
    loader_eval_batches,
    loss_of,
    make_optimizer,
    memory_eval_batches,
    optimizer_implementation,
    phase_peaks,
    rank_device,
    sync,
    to_tensors,
)
from trainscale.runners.torch.torch_speed import laid_out, memory_format, model_facts


def _all_sum(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


#: trainscale precision -> Lightning's precision flag (autocast, as torch-ddp runs it)
PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}

#: why the `communication` block is empty: Lightning's DDP forward is its training_step, so
#: there is no no-sync compute step to time against its synchronised one
NO_EXPOSED = (
    "lightning-ddp: not measured; Lightning's DDP module runs its training_step, not a plain "
    "forward, so the no-sync compute step of torch-ddp cannot be timed inside it"
)

# A loader over tensors already in memory needs no worker processes; Lightning says otherwise.
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


class Classifier(pl.LightningModule):
    """The trainscale model, its loss and optimizer as Lightning's hooks."""

    def __init__(self, net: torch.nn.Module, spec: RunSpec) -> None:
        super().__init__()
        self.net, self.spec = net, spec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        return loss_of(self.net(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.spec, self.parameters())


class EpochClock(pl.Callback):
    """Barrier-timed epochs, step times, the fault hook and the test score, as torch-ddp has
    them; each finished epoch goes into the Recorder."""

    def __init__(self, run: LightningRun) -> None:
        self.run = run
        self.t_epoch = 0.0
        self.timer = StepTimer(run.device)
        self.losses: list[torch.Tensor] = []  # read after the epoch: no per-step wait

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.run.rec.training_starts()
        self.run.gpu.start()

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.timer = StepTimer(self.run.device)  # CUDA events on a GPU: no per-step wait
        self.losses = []
        self.run.barrier()
        self.t_epoch = time.perf_counter()

    # a step is grad_accum batches of Lightning's (micro-batches): timed from its first to its
    # last; Lightning's loss of each is divided by grad_accum already, so a step's is their sum
    def on_train_batch_start(self, trainer, module, batch, batch_idx: int) -> None:
        step, micro = divmod(batch_idx, self.run.spec.grad_accum)
        if micro:
            return
        if step == self.run.steps // 2:
            maybe_fault(self.run.spec, self.run.rk.rank, trainer.current_epoch + 1)
        self.timer.step_starts()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx: int) -> None:
        self.losses.append(outputs["loss"].detach().float())
        if (batch_idx + 1) % self.run.spec.grad_accum == 0:
            self.timer.step_ends()

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.run.barrier()  # the device's work done: the steps' events have their times
        seconds = time.perf_counter() - self.t_epoch
        epoch = trainer.current_epoch + 1
        if not self.run.epoch_done(epoch, seconds, self.losses, self.timer.seconds()):
            trainer.should_stop = True  # diverged: on every rank (the losses are all-reduced)

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.run.memory.training_ends()  # before the Trainer's teardown empties CUDA's cache


class LightningRun:
    """One rank's run: data, model, the Trainer, and rank 0's record."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.rec = metrics.Recorder(spec.to_dict())
        self.rk = detect_rank()
        torch.set_num_threads(spec.threads_per_worker)
        self.device, shared = rank_device(
            self.rk.local_rank, self.rk.local_world_size, spec.accelerator
        )
        self.cuda = self.device.type == "cuda"
        self.rank_cpus = [metrics.cpu_count()]  # every rank's, once gathered (env.rank_cpus)
        self.backend = group_backend(self.device, shared)
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.tokens = spec.seq_len > 0  # windows of token ids, next-token targets
        self.feed = self.token_data() if self.tokens else self.image_data()
        if spec.grad_accum > 1:  # the Trainer accumulates them (accumulate_grad_batches)
            self.feed = MicroBatches(self.feed, spec.grad_accum)
        self.rec.timeline.ends("data")  # the set-up's phases, for the record's timeline
        torch.manual_seed(spec.seed)  # the same fresh initial weights as torch-ddp's
        self.net = models.build(spec.model, self.info.shape, self.info.num_classes, spec.own_model,
                                seed=spec.seed)  # fmt: skip
        checkpointing.apply(self.net, spec.own_model, spec.activation_checkpointing)
        self.net.to(self.device, memory_format=memory_format(spec))
        self.rec.timeline.ends("model")
        uuid = torch.cuda.get_device_properties(self.device).uuid if self.cuda else None
        self.uuid = str(uuid) if uuid is not None else None  # which GPU's counter it reads
        reader = metrics.GpuMonitor.nvml_reader(self.device.index, uuid) if self.cuda else None
        self.gpu = metrics.GpuMonitor(read=reader)
        self.memory: PhasePeaks = phase_peaks(self.device)
        self.test = {"accuracy": None, "loss": None}
        #: evaluation and the measurements after training: each may fail, the run goes on
        self.parts = Parts(spec, self.rec.warnings, _every_rank, self.rec.timeline)

    def image_data(self) -> DataLoader:
        """The in-memory arrays on the device and torch-ddp's order of them, as a DataLoader of
        whole batches; sets the steps per epoch and the record's sample counts."""
        spec, rk = self.spec, self.rk
        arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
        self.info = arrays.info
        self.train_x, self.train_y, self.test_x, self.test_y = to_tensors(arrays, self.device)
        self.train_x, self.test_x = laid_out(self.train_x, spec), laid_out(self.test_x, spec)
        n = len(self.train_y)
        train_samples = n * spec.scale
        self.samples = {"train_samples": train_samples, "test_samples": len(self.test_y)}
        self.steps = steps_per_epoch(
            train_samples, rk.world_size, spec.per_worker_batch_size, spec.steps_per_epoch
        )
        check_steps(self.steps, spec.path, train_samples, spec.global_batch_size)
        batches = ShardBatches(spec, rk, n, self.steps, self.device)
        return DataLoader(InMemory(self.train_x, self.train_y), sampler=batches, batch_size=None)

    def token_data(self) -> WindowEpochs:
        """This rank's token windows from the torch loop's own loaders (tokendata.loaders at the
        same rank, world and seed, epochs numbered alike), so Lightning trains on the windows
        torch-ddp trains on, in its order; the steps and sample counts (windows) as it counts
        them."""
        spec, rk, batch = self.spec, self.rk, self.spec.per_worker_batch_size
        self.info = imagesets.spec_info(spec.to_dict())  # shape (seq_len,), vocab as classes
        train, self.test_windows = tokendata.loaders(spec, rk.rank, rk.world_size, batch)
        self.samples = {"train_samples": train.windows.count,
                        "test_samples": self.test_windows.windows.windows}  # fmt: skip
        limit = spec.steps_per_epoch
        self.steps = train.steps if limit is None else min(train.steps, limit)
        fed = train.steps * batch * rk.world_size
        check_steps(self.steps, spec.path, fed, spec.global_batch_size)
        return WindowEpochs(train, self.steps, self.device)

    def test_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """This rank's test batches for torch_parts.evaluate, as the torch loop makes them."""
        rk = self.rk
        if self.tokens:
            return loader_eval_batches(self.test_windows.epoch(1), self.device, _all_sum,
                                       self.info.shape, tokens=True)  # fmt: skip
        return memory_eval_batches(
            self.test_x, self.test_y, rk.rank, rk.world_size, self.spec.per_worker_batch_size
        )

    def barrier(self) -> None:
        sync(self.device)
        dist.barrier()

    def epoch_done(
        self, epoch: int, seconds: float, losses: list[torch.Tensor], step_seconds: list[float]
    ) -> bool:
        """Record a finished epoch; False where its loss diverged (trainscale.measure.divergence),
        which then goes unrecorded and ends the run."""
        spec, rk = self.spec, self.rk
        per_step = torch.stack(losses) if losses else torch.zeros(0, device=self.device)
        per_step = per_step.view(-1, spec.grad_accum).sum(1)  # micro-batches into steps
        dist.all_reduce(per_step)  # each step's loss summed over ranks, the same on every rank
        per_step /= rk.world_size
        train_loss = (per_step.sum() / self.steps).item()
        if self.rec.losses.epoch(epoch, per_step.tolist()) is not None:
            if rk.is_main:
                print(f"epoch {epoch}/{spec.epochs}: {self.rec.losses.diverged.message()}")
            return False
        scored = evaluates(spec, self.info.synthetic, epoch) and not self.parts.failed("evaluation")
        if scored:
            scores = self.parts.run("evaluation", self.evaluate, epoch=epoch)
            scored = scores is not None
            self.test = scores if scored else {"accuracy": None, "loss": None}
        e = self.rec.epoch(
            seconds,
            samples=self.steps * spec.global_batch_size,
            steps=self.steps,
            train_loss=train_loss,
            step_seconds=step_seconds,
            test_accuracy=self.test["accuracy"] if scored else None,
            test_loss=self.test["loss"] if scored else None,
        )
        waits: list = [None] * rk.world_size
        dist.all_gather_object(waits, self.waits.seconds)
        e.update(datawait.epoch_fields(self.waits.seconds, waits))
        if rk.is_main:
            print(
                f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, "
                f"{fmt_rate(e['samples_per_second'])} samples/s, loss {train_loss:.4f}",
                flush=True,
            )
        return True

    def evaluate(self) -> dict:
        """torch-ddp's test scores of the trained net, its memory kept apart from training's."""
        self.memory.evaluation_starts()
        try:
            return evaluate(self.net, self.test_batches(), self.device, self.info.num_classes,
                            _all_sum, tokens=self.tokens)  # fmt: skip
        finally:
            self.memory.evaluation_ends()

    def trainer(self, out: str) -> pl.Trainer:
        spec = self.spec
        return pl.Trainer(
            strategy=DDPStrategy(process_group_backend=self.backend),
            accelerator="gpu" if self.cuda else "cpu",
            devices=spec.workers,
            num_nodes=spec.nodes,
            precision=PRECISION[spec.precision],
            max_epochs=spec.epochs,
            accumulate_grad_batches=spec.grad_accum,
            use_distributed_sampler=False,  # the data order is torch-ddp's (ShardBatches)
            callbacks=[EpochClock(self)],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=os.path.dirname(os.path.abspath(out)),
        )

    def fit(self, out: str) -> None:
        self.waits = SizedWait(self.feed)
        module = Classifier(self.net, self.spec)
        if self.spec.compile:  # as Lightning documents it: its training_step is compiled
            module = torch.compile(module)
        self.trainer(out).fit(module, train_dataloaders=self.waits)

    def gather(self) -> tuple[torch.Tensor, float | None, float | None, list[str]]:
        """Every rank's peaks (rows), the mean utilisation and summed energy, and the hosts."""
        utilization, energy = self.gpu.stop()
        row = self.memory.finish() + self.memory.gpu_held()  # reserved, NVML: NaN if not read
        peaks = torch.tensor(row, dtype=torch.float64, device=self.device)
        gathered = [torch.zeros_like(peaks) for _ in range(self.rk.world_size)]
        dist.all_gather(gathered, peaks)
        per_rank = torch.stack(gathered).cpu()
        usage: list = [None] * self.rk.world_size  # (host, GPU, energy, utilisation) per rank
        place = (metrics.hostname(), self.uuid, energy, utilization, metrics.cpu_count())
        dist.all_gather_object(usage, place)
        self.rank_cpus = [u[4] for u in usage]
        if self.cuda:
            energy = energy_once_per_device([u[2] for u in usage], [u[:2] for u in usage])
            utils = [u[3] for u in usage if u[3] is not None]
            utilization = sum(utils) / len(utils) if utils else None
        return per_rank, utilization, energy, [u[0] for u in usage]

    def report(self, out: str) -> None:
        """Every rank's memory peaks and host name gathered; rank 0 writes the record. A part
        after training may fail without losing it (trainscale.runners.guarded)."""
        gathered = self.parts.run("memory", self.gather)
        per_rank, utilization, energy, hosts = gathered or (None, None, None, [metrics.hostname()])
        if self.rk.world_size > 1:
            self.rec.communication = block(self.rec.epochs, None, None, NO_EXPOSED)
        if not self.rk.is_main:
            return
        frameworks = {"torch": torch.__version__, "lightning": lightning.__version__}
        env = metrics.environment(self.rec.start_utc, frameworks, hosts)
        env["cuda"] = torch.version.cuda if self.cuda else None
        env["driver"] = metrics.driver_version() if self.cuda else None
        env["process_group_backend"] = self.backend
        env["rank_cpus"] = self.rank_cpus
        counted = self.parts.run(
            "flops", lambda: flop_count.counted(self.spec, self.info.shape, self.info.num_classes,
                                                self.device, out, self.spec.world_size),
            collective=False,
        )  # fmt: skip
        memory = {"peak_host_rss_bytes": None, "peak_device_bytes": None}
        if per_rank is not None:
            memory = ranks_memory(per_rank.tolist(), self.cuda)
        result = self.rec.record(
            flops=counted,
            model={
                "params": models.param_count(self.net),
                "build": "whole",
                **model_facts(self.net),
            },  # fmt: skip
            data=self.samples,
            test=dict(self.test),
            memory=memory,
            device={
                "kind": self.device.type,
                "name": torch.cuda.get_device_name(self.device)
                if self.cuda
                else metrics.cpu_name(),
                "count": self.spec.world_size,
                "utilization_mean": utilization,
                "energy_joules": energy,
            },
            env=env,
            oversubscribed=check_oversubscribed(self.spec.workers, self.spec.threads_per_worker),
            launch=metrics.launch_info(),
            optimizer={"implementation": optimizer_implementation(self.spec, self.device.type)},
        )
        write_ok(out, result, result["test"]["accuracy"])


def _every_rank(error: str | None) -> list[str | None]:
    """Every rank's outcome of a part (runners.guarded.Parts' agreement)."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, error)
    return out


@record
def main(spec: RunSpec, out: str) -> None:
    run = LightningRun(spec)
    run.fit(out)
    run.report(out)
    leave()  # without the gloo teardown (see pytorch.leave), nor Lightning's atexit one

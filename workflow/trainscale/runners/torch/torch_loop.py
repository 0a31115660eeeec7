"""The one training loop of every PyTorch-family strategy: torch, torch-dp, torch-ddp and
torch-fsdp (pytorch.py), torch-pipeline (pipeline.py), deepspeed-zero0..3
(deepspeed_zero.py), horovod-torch and horovod-torch-elastic (horovod_torch.py).

The loop owns everything that must be done alike for the figures to compare: set-up (rank,
device, threads, seeds, data), the sharded data order, the barrier-timed epochs with the fault
hook half-way through each, evaluation, the gather of every rank's peak memory, utilisation
and energy, and the record rank 0 writes. So every runner of the family records the same keys.
A strategy is a `Plugin` (plugin.py) on it: it joins its process group, wraps the model, steps,
scores the test set, adds its own record blocks and tears down, in the style of its
framework's own tutorial (DistributedSampler shards, rank 0 writes). Every rank runs the same
number of steps, so no rank ever waits in a collective for one that stopped on its own clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Iterator

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from trainscale import data
from trainscale.data import imagedata, imagesets, tokendata
from trainscale.measure import datawait, metrics
from trainscale.measure.device_usage import CpuUsage, energy_once_per_device
from trainscale.measure.memory import ranks_memory
from trainscale.models import torch_models as models
from trainscale.models.init import on_meta
from trainscale.plan.matrix import RunSpec
from trainscale.runners.common import (
    check_oversubscribed,
    check_steps,
    evaluates,
    fmt_rate,
    maybe_fault,
    steps_per_epoch,
    write_ok,
)
from trainscale.runners.guarded import Parts
from trainscale.runners.torch import checkpointing, flop_count
from trainscale.runners.torch.exposed import batches_of, block
from trainscale.runners.torch.plugin import Plugin, Shard
from trainscale.runners.torch.step_timer import StepTimer
from trainscale.runners.torch.torch_parts import (
    group_backend,
    loader_eval_batches,
    make_optimizer,
    memory_eval_batches,
    optimizer_implementation,
    phase_peaks,
    rank_device,
    skipped_block,
    sync,
    to_tensors,
)
from trainscale.runners.torch.torch_speed import (
    compiled_graphs,
    laid_out,
    memory_format,
    weight_layout,
)


class Loop:
    """One run: `run()` sets up, trains every epoch through the plug-in and writes the record."""

    def __init__(self, spec: RunSpec, plugin: type[Plugin]) -> None:
        self.spec = spec
        self.rec = metrics.Recorder(spec.to_dict())
        self.plugin = plugin(self)
        self.test: dict = {"accuracy": None, "loss": None}

    def set_up(self) -> None:
        spec, p = self.spec, self.plugin
        self.rk = p.rank()
        torch.set_num_threads(spec.threads_per_worker)
        self.device, shared = rank_device(
            self.rk.local_rank, self.rk.local_world_size, spec.accelerator
        )
        self.cuda = self.device.type == "cuda"
        self.rank_cpus = [metrics.cpu_count()]  # every rank's, once gathered (env.rank_cpus)
        self.node_gpus: list[dict] = []  # every node's GPUs, once gathered (env.gpus)
        self.backend = group_backend(self.device, shared) if p.grouped else None
        if self.cuda:
            torch.cuda.set_device(self.device)
        p.connect(self.device)
        mark = self.rec.timeline.ends  # the set-up's phases, for the record's timeline
        mark("rendezvous")
        per_worker = p.batch_of == "worker"
        self.batch = spec.per_worker_batch_size if per_worker else spec.global_batch_size
        rank, replicas = p.data_rank()
        self.loader = None
        self.tokens = spec.seq_len > 0  # windows of token ids, next-token targets
        if spec.image_source is None and not self.tokens:
            arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
            shape = imagesets.spec_info(spec.to_dict()).shape  # image_size resizes per batch
            self.info = dataclasses.replace(arrays.info, shape=shape)
            self.train_x, self.train_y, self.test_x, self.test_y = to_tensors(arrays, self.device)
            self.train_x, self.test_x = laid_out(self.train_x, spec), laid_out(self.test_x, spec)
            self.n = len(self.train_y)
            self.train_samples = self.n * spec.scale
            full = steps_per_epoch(self.train_samples, replicas, self.batch, spec.steps_per_epoch)
        else:  # the user's images, decoded while training (imagedata), or token windows
            self.info = imagesets.spec_info(spec.to_dict())
            if self.tokens:
                self.loader, self.test_loader = tokendata.loaders(spec, rank, replicas, self.batch)
            else:
                self.loader, self.test_loader = imagedata.loaders(
                    spec, rank, replicas, self.cuda, self.batch
                )
            self.train_samples = self.loader.steps * self.batch * replicas
            full = self.loader.steps
            if spec.steps_per_epoch is not None:
                full = min(full, spec.steps_per_epoch)
        self.steps = full
        check_steps(self.steps, spec.path, self.train_samples, spec.global_batch_size)
        mark("data")
        torch.manual_seed(spec.seed)  # same fresh initial weights on every rank and repeat
        net = p.build()
        self.built = "meta" if on_meta(net) else p.built
        self.params = models.param_count(net)
        p.wrap(net)
        mark("model")
        self.layout = weight_layout(net)  # as wrapping left it (ZeRO flattens, FSDP shards)
        del net  # a pipeline stage keeps only its blocks
        self.memory = phase_peaks(self.device)
        uuid = torch.cuda.get_device_properties(self.device).uuid if self.cuda else None
        self.uuid = str(uuid) if uuid is not None else None  # which GPU's counter this rank reads
        read = metrics.GpuMonitor.nvml_reader(self.device.index, uuid) if self.cuda else None
        self.gpu = metrics.GpuMonitor(read=read)
        self.cpu = None if self.cuda else CpuUsage(spec.threads_per_worker, self.rk.local_rank == 0)
        #: evaluation and the measurements after training: each may fail, the run goes on
        self.parts = Parts(spec, self.rec.warnings, p.gather_object, self.rec.timeline)

    def build_model(self, meta: bool = False) -> torch.nn.Module:
        """The run's model as `models.build` makes it from the run's seed (on the meta device
        where `meta` asks and the model initialises module by module), its blocks checkpointed
        as the run asks (checkpointing.py), in the run's memory format (torch_speed.py)."""
        spec = self.spec
        net = models.build(spec.model, self.info.shape, self.info.num_classes, spec.own_model,
                           seed=spec.seed, meta=meta)  # fmt: skip
        checkpointing.apply(net, spec.own_model, spec.activation_checkpointing)
        return net if on_meta(net) else net.to(memory_format=memory_format(self.spec))

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """The study's optimizer over `params`; the record says how it steps them."""
        params = list(params)
        device_type = params[0].device.type if params else self.device.type
        self.optimizer_implementation = optimizer_implementation(self.spec, device_type)
        return make_optimizer(self.spec, params)

    def batches(self, shard: Shard, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches of the epoch, on the device: the in-memory tensors indexed by
        the shard's order (resized where `image_size` asks), or the loader's decoded images."""
        dev, size = self.device, self.spec.image_size
        if self.loader is None:
            order, b = shard.order, shard.batch
            for step in range(shard.steps):
                idx = order[step * b : (step + 1) * b]
                x = imagedata.resize_batch(self.train_x[idx], size)
                yield laid_out(x, self.spec), self.train_y[idx]  # a no-op unless resized
            return
        for x, y in itertools.islice(self.loader.epoch(epoch), shard.steps):
            yield laid_out(x.to(dev, non_blocking=True), self.spec), y.to(dev, non_blocking=True)

    def test_batches(self, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """This rank's test batches as (x, y, counted) for torch_parts.evaluate: equally many
        on every rank (a sharded model's forward is a collective)."""
        if self.loader is None:
            x, y, size = self.test_x, self.test_y, self.spec.image_size
            return memory_eval_batches(x, y, *self.plugin.data_rank(), batch, size)
        return loader_eval_batches(
            self.test_loader.epoch(1), self.device, self.plugin.all_sum, self.info.shape,
            self.tokens,
        )  # fmt: skip

    def sample_batches(self, size: int, dtype: torch.dtype | None = None):
        """batches(i) of `size` samples for the no-sync steps (exposed.py): the last
        epoch's order in memory; on user data a few freshly decoded batches, cycled."""
        if self.loader is None:
            return batches_of(
                self.train_x, self.train_y, self.last_shard.order, size, dtype,
                self.spec.image_size,
            )  # fmt: skip
        drawn = list(self.batches(self.last_shard._replace(steps=2), self.spec.epochs + 1))
        xs = torch.cat([x for x, _ in drawn])
        ys = torch.cat([y for _, y in drawn])
        return batches_of(xs, ys, torch.arange(len(ys), device=self.device), size, dtype)

    def epoch(self, epoch: int) -> dict | None:
        """One barrier-timed epoch over this rank's shard, then its evaluation; its record, or
        None where the loss diverged in it (trainscale.measure.divergence: the run stops)."""
        spec, p, dev = self.spec, self.plugin, self.device
        p.epoch_starts(epoch)
        shard = self.last_shard = p.shard(epoch)
        steps = shard.steps
        batches = datawait.DataWait(self.batches(shard, epoch))
        losses = []  # summed after the timed epoch: no per-step add
        timer = StepTimer(dev)  # CUDA events on a GPU: no per-step wait for the device
        sync(dev)
        p.barrier()
        if self.cpu:
            self.cpu.span_starts()
        t_epoch = time.perf_counter()
        for step, (x, y) in enumerate(batches):
            if step == steps // 2:
                maybe_fault(spec, self.rk.rank, epoch)
            timer.step_starts()
            losses.append(p.step(x, y))
            timer.step_ends()
        sync(dev)
        p.barrier()
        seconds = time.perf_counter() - t_epoch
        step_seconds = timer.seconds()
        if self.cpu:
            self.cpu.span_ends()
        waits = p.gather_object(batches.seconds)  # every rank's wait, after the timed span
        # each step's loss, the mean over ranks: one all-reduce after the timed span, so every
        # rank sees the same losses and stops after the same epoch if they diverged
        stacked = torch.stack(losses).float() if losses else torch.zeros(0, device=dev)
        per_step = p.all_sum(stacked) / p.losses_per_step()
        train_loss = (per_step.sum() / steps).item()
        if self.rec.losses.epoch(epoch, per_step.tolist()) is not None:
            if self.rk.is_main:
                print(f"epoch {epoch}/{spec.epochs}: {self.rec.losses.diverged.message()}")
            return None  # not recorded: its figures are of steps that trained nothing
        scored = evaluates(spec, self.info.synthetic, epoch) and not self.parts.failed("evaluation")
        if scored:
            scores = self.parts.run("evaluation", lambda: self.evaluate(shard.batch), epoch=epoch)
            scored = scores is not None
            self.test = scores if scored else {"accuracy": None, "loss": None}
        e = self.rec.epoch(
            seconds,
            samples=steps * shard.step_samples,
            steps=steps,
            train_loss=train_loss,
            step_seconds=step_seconds,
            test_accuracy=self.test["accuracy"] if scored else None,
            test_loss=self.test["loss"] if scored else None,
        )
        e.update(datawait.epoch_fields(batches.seconds, waits))
        if self.rk.is_main:
            print(
                f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, {p.world_size} workers, "
                f"{fmt_rate(e['samples_per_second'])} samples/s, loss {train_loss:.4f}, "
                f"data wait {batches.seconds:.3f} s",
                flush=True,
            )
        return e

    def evaluate(self, batch: int) -> dict:
        """The plug-in's test scores, its memory kept apart from training's peaks."""
        self.memory.evaluation_starts()
        try:
            return {"accuracy": None, "loss": None, **self.plugin.evaluate(batch)}
        finally:
            self.memory.evaluation_ends()

    def samples(self) -> dict:
        """The record's train and test sample counts (user data: counted in its files)."""
        if self.loader is None:
            return {"train_samples": self.train_samples, "test_samples": len(self.test_y)}
        if self.tokens:  # windows of seq_len ids
            return {"train_samples": self.loader.windows.count,
                    "test_samples": self.test_loader.windows.windows}  # fmt: skip
        source = self.spec.image_source
        return {s + "_samples": imagesets.count(source, s) for s in ("train", "test")}

    def usage(self) -> tuple[float | None, float | None]:
        """This rank's (utilisation %, energy J) over training: NVML on a GPU, else the CPU
        busy share and RAPL energy of the timed epochs (trainscale.measure.device_usage)."""
        gpu = self.gpu.stop()
        return gpu if self.cuda else self.cpu.result()

    def gather(self) -> tuple[torch.Tensor, float | None, float | None, list]:
        """Every rank's peaks (rows of PhasePeaks.finish and gpu_held), the mean utilisation
        and summed energy over ranks (None where no rank measured one) and every rank's host
        name."""
        util, energy = self.usage()
        row = self.memory.finish() + [math.nan if v is None else v for v in (util, energy)]
        row += self.memory.gpu_held()  # reserved, NVML process: NaN where not read
        rows = self.plugin.all_gather(torch.tensor(row, dtype=torch.float64, device=self.device))
        rows = rows.cpu()
        utils = [v for v in rows[:, 4].tolist() if not math.isnan(v)]
        energies = [None if math.isnan(v) else v for v in rows[:, 5].tolist()]
        # each node's GPUs from its local rank 0 (env.gpus), each rank's CPUs (env.rank_cpus)
        gpus = self.rec.node_gpus() if self.rk.local_rank == 0 else []
        places = self.plugin.gather_object(
            (metrics.hostname(), self.uuid, metrics.cpu_count(), gpus)
        )
        self.rank_cpus = [place[2] for place in places]
        self.node_gpus = [gpu for place in places for gpu in place[3]]
        return (
            torch.cat([rows[:, :4], rows[:, 6:8]], dim=1),
            sum(utils) / len(utils) if utils else None,
            energy_once_per_device(energies, [place[:2] for place in places]),
            [place[0] for place in places],
        )

    def report(self, out: str) -> None:
        """The gathers, the plug-in's extra measurements and blocks, and rank 0's record. Each
        part after training may fail without losing the record (trainscale.runners.guarded):
        its figures stay null and the record's `warnings` say why."""
        p, cuda, parts = self.plugin, self.cuda, self.parts
        graphs = {"compiled_graphs": compiled_graphs()}  # before the no-sync steps compile more
        gathered = parts.run("memory", self.gather)
        per_rank, utilization, energy, hosts = gathered or (None, None, None, [metrics.hostname()])
        if p.world_size > 1 and self.rec.diverged:
            self.rec.communication = block([], None, None, "not measured: the run diverged")
        elif p.world_size > 1:  # after the timed epochs and the peaks; in none of their figures
            comm = parts.run("communication", lambda: p.exposed(self.last_shard))
            if comm is not None:
                self.rec.communication = comm
            elif parts.failed("communication"):
                self.rec.communication = block([], None, None, "not measured: it failed (warnings)")
        if parts.run("framework", p.finish) is None and parts.failed("framework"):
            p.extra_blocks, p.extra_memory = {}, {}
        if not self.rk.is_main:
            return
        env = metrics.environment(
            self.rec.start_utc, {"torch": torch.__version__, **p.frameworks}, hosts
        )
        env["cuda"] = torch.version.cuda if cuda else None
        env["driver"] = metrics.driver_version() if cuda else None
        env["process_group_backend"] = self.backend
        env["rank_cpus"] = self.rank_cpus
        env["gpus"] = self.node_gpus  # [] where not gathered: Recorder.record reads this node
        env.update(p.env_extra)
        memory = {"peak_host_rss_bytes": None, "peak_device_bytes": None, **p.extra_memory}
        if per_rank is not None:
            memory.update(ranks_memory(per_rank.tolist(), cuda))
        counted = parts.run(
            "flops", lambda: flop_count.counted(self.spec, self.info.shape,
                                                self.info.num_classes, self.device, out,
                                                p.device_count),
            collective=False,
        )  # fmt: skip
        result = self.rec.record(
            flops=counted,
            model={
                "params": self.params,
                "memory_format": self.layout,
                "build": self.built,
                **graphs,
            },  # fmt: skip
            data=self.samples(),
            test=dict(self.test),
            memory=memory,
            device={
                "kind": self.device.type,
                "name": torch.cuda.get_device_name(self.device) if cuda else metrics.cpu_name(),
                "count": p.device_count,
                "utilization_mean": utilization,
                "energy_joules": energy,
            },
            env=env,
            oversubscribed=check_oversubscribed(
                self.spec.workers, self.spec.threads_per_worker + self.spec.loader_workers
            ),
            launch=metrics.launch_info(),
            **p.extra_blocks,
            optimizer={"implementation": self.optimizer_implementation},
            **offload_block(self.spec, self.device),
            **skipped_block(p.skipped_steps()),
        )
        write_ok(out, result, result["test"]["accuracy"])


def offload_block(spec: RunSpec, device: torch.device) -> dict:
    """The record's `offload` block, where the run offloads: what, and whether it moved (a
    CPU run's device is the host: the offloading code runs, nothing leaves the device)."""
    if spec.offload == "none":
        return {}
    return {"offload": {"mode": spec.offload, "to": "cpu", "moved": device.type != "cpu"}}


@record
def run(plugin: type[Plugin], spec: RunSpec, out: str) -> None:
    """Train `spec` with the strategy `plugin` and write its metrics to `out` (rank 0)."""
    loop = Loop(spec, plugin)
    loop.set_up()
    loop.rec.training_starts()
    loop.gpu.start()
    loop.plugin.train()
    loop.report(out)
    loop.plugin.teardown()

"""Horovod with PyTorch: `horovod-torch` (hvd.DistributedOptimizer, ring all-reduce) and
`horovod-torch-elastic` (the same loop under hvd.elastic.run: workers may leave or join).

Started by `horovodrun` (gloo on CPU, NCCL/MPI where the build has them), one process per
worker. The loop is runners/pytorch.py's, in Horovod's own recipe: rank from `hvd.init()`, the
gradient average in `hvd.DistributedOptimizer`, initial parameters and optimizer state
broadcast from rank 0, metrics reduced with `hvd.allreduce`, rank 0 writes. Same data shards
(DistributedSampler), model, hyper-parameters and steps per epoch as `torch-ddp`.

Horovod's `broadcast_optimizer_state` initialises an empty optimizer state by one step with
zero gradients (so Adam's step count starts at 1, not 0): that is what every Horovod program
does, so it is kept; it moves no weight (zero gradient, and weight decay aside).

Elastic: the state (model, optimizer, epoch, the epoch records so far and the membership log)
is committed after every epoch. When the host discovery script reports fewer or more slots,
the workers stop at the next commit, Horovod re-forms the ring and the run goes on with the
new world size: the *global* batch stays the spec's (each worker takes global / size), so the
optimisation is unchanged. A worker that dies mid-epoch costs that epoch: the state rolls back
to the last commit and the epoch runs again. Each change lands in the metrics'
`horovod.elastic.membership`.
"""

from __future__ import annotations

import os
import time

import horovod
import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from trainscale import data, metrics, models
from trainscale.matrix import RunSpec
from trainscale.memory import memory_block
from trainscale.runners.common import (
    check_oversubscribed,
    check_steps,
    evaluates,
    fmt_rate,
    maybe_fault,
    steps_per_epoch,
)
from trainscale.runners.exposed import batches_of, measure_exposed_communication
from trainscale.runners.pytorch import (
    DTYPES,
    _Indexable,
    evaluate,
    make_optimizer,
    phase_peaks,
    sync,
    to_tensors,
)


def barrier(device: torch.device) -> None:
    sync(device)
    hvd.barrier()


def test_scores(model, x, y, batch: int) -> tuple[float, float]:
    """Test accuracy and loss over the whole test set: each rank scores its stride in batches
    of `batch`, then the strides' sums are added with hvd.allreduce (stride r holds
    len(range(r, n, size)) images)."""
    rank, size = hvd.rank(), hvd.size()
    acc, loss = evaluate(model, x, y, rank, size, False, batch)
    count = len(range(rank, len(y), size))
    total = hvd.allreduce(
        torch.tensor([acc * count, loss * count], dtype=torch.float64), op=hvd.Sum
    )
    return (total[0] / len(y)).item(), (total[1] / len(y)).item()


class Trainer:
    """The model, data and recorder of one run; `epoch()` trains one epoch at the current size."""

    def __init__(self, spec: RunSpec, rec: metrics.Recorder, device: torch.device) -> None:
        self.spec, self.rec, self.device = spec, rec, device
        arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
        self.synthetic = arrays.info.synthetic
        self.train_x, self.train_y, self.test_x, self.test_y = to_tensors(arrays, device)
        self.train_samples = len(self.train_y) * spec.scale
        self.steps = steps_per_epoch(
            self.train_samples, spec.world_size, spec.per_worker_batch_size, spec.steps_per_epoch
        )
        check_steps(self.steps, spec.path, self.train_samples, spec.global_batch_size)
        torch.manual_seed(spec.seed)  # same fresh initial weights on every rank and repeat
        self.net = models.build(spec.model, arrays.info.shape, arrays.info.num_classes).to(device)
        self.opt = hvd.DistributedOptimizer(
            make_optimizer(spec, self.net.parameters()),
            named_parameters=self.net.named_parameters(),
            op=hvd.Average,
        )
        self.dtype = DTYPES[spec.precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=spec.precision == "fp16")
        self.test = {"accuracy": None, "loss": None}
        self.memory = phase_peaks(device)

    def epoch(self, epoch: int) -> dict:
        """One epoch over this rank's shard at the current world size; returns its record."""
        spec, dev, size = self.spec, self.device, hvd.size()
        b = spec.global_batch_size // size  # the global batch is the spec's at any size
        sampler = DistributedSampler(
            _Indexable(self.train_samples), num_replicas=size, rank=hvd.rank(),
            shuffle=True, seed=spec.seed, drop_last=True,
        )  # fmt: skip
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), device=dev) % len(self.train_y)
        steps = min(self.steps, len(order) // b)
        loss_sum = torch.zeros((), device=dev)
        step_seconds = []
        barrier(dev)
        t_epoch = time.perf_counter()
        for step in range(steps):
            if step == steps // 2:
                maybe_fault(spec, hvd.rank(), epoch)
            t_step = time.perf_counter()
            idx = order[step * b : (step + 1) * b]
            with torch.autocast(dev.type, dtype=self.dtype, enabled=self.dtype is not None):
                loss = F.cross_entropy(self.net(self.train_x[idx]), self.train_y[idx])
            self.opt.zero_grad()  # Horovod's takes no set_to_none; None is torch's default
            if self.scaler.is_enabled():  # fp16: Horovod's AMP recipe
                self.scaler.scale(loss).backward()
                self.opt.synchronize()  # all-reduce first, then unscale and step
                with self.opt.skip_synchronize():
                    self.scaler.step(self.opt)
                self.scaler.update()
            else:
                loss.backward()
                self.opt.step()
            loss_sum += loss.detach().float()
            sync(dev)
            step_seconds.append(time.perf_counter() - t_step)
        barrier(dev)
        seconds = time.perf_counter() - t_epoch
        train_loss = hvd.allreduce(loss_sum.cpu(), op=hvd.Average).item() / steps
        scored = evaluates(spec, self.synthetic, epoch)
        if scored:
            self.memory.evaluation_starts()
            acc, loss = test_scores(self.net, self.test_x, self.test_y, b)
            self.memory.evaluation_ends()
            self.test.update(accuracy=acc, loss=loss)
        e = self.rec.epoch(
            seconds,
            samples=steps * b * size,
            steps=steps,
            train_loss=train_loss,
            step_seconds=step_seconds,
            test_accuracy=self.test["accuracy"] if scored else None,
            test_loss=self.test["loss"] if scored else None,
        )
        if hvd.rank() == 0:
            print(
                f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, {size} workers, "
                f"{fmt_rate(e['samples_per_second'])} samples/s, loss {train_loss:.4f}",
                flush=True,
            )
        return e


def train_elastic(trainer: Trainer) -> list[dict]:
    """hvd.elastic.run over the epochs: commit after each, log every change of membership."""
    spec = trainer.spec
    state = hvd.elastic.TorchState(
        trainer.net, trainer.opt, epoch=1, history=[], membership=[], test=trainer.test
    )

    @hvd.elastic.run
    def train(state) -> None:
        # state was just synced from rank 0: every rank holds the same records
        trainer.rec.epochs = [dict(e) for e in state.history]
        trainer.test = dict(state.test)
        if not state.membership or state.membership[-1]["world_size"] != hvd.size():
            state.membership.append(
                {"after_epoch": state.epoch - 1, "world_size": hvd.size(), "utc": metrics.utc_now()}
            )
            if hvd.rank() == 0:
                print(f"horovod elastic: {hvd.size()} workers from epoch {state.epoch}", flush=True)
        while state.epoch <= spec.epochs:
            trainer.epoch(state.epoch)
            state.history = [dict(e) for e in trainer.rec.epochs]
            state.test = dict(trainer.test)
            state.epoch += 1
            state.commit()  # a save point; also where a change of hosts interrupts

    train(state)
    return state.membership


def main(spec: RunSpec, out: str) -> None:
    rec = metrics.Recorder(spec.to_dict())
    hvd.init()
    torch.set_num_threads(spec.threads_per_worker)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{hvd.local_rank()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    elastic = spec.strategy == "horovod-torch-elastic"
    if not elastic and hvd.size() != spec.world_size:
        raise RuntimeError(
            f"horovodrun started {hvd.size()} workers, the run needs {spec.world_size}"
        )
    trainer = Trainer(spec, rec, device)
    uuid = torch.cuda.get_device_properties(device).uuid if cuda else None
    gpu = metrics.GpuMonitor(
        read=metrics.GpuMonitor.nvml_reader(device.index, uuid) if cuda else None
    )
    rec.training_starts()
    gpu.start()
    membership = None
    if elastic:
        membership = train_elastic(trainer)
    else:
        hvd.broadcast_parameters(trainer.net.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(trainer.opt, root_rank=0)
        for epoch in range(1, spec.epochs + 1):
            trainer.epoch(epoch)
    utilization, energy = gpu.stop()

    # Peak memory: max over ranks; energy summed, utilisation averaged; every rank's host.
    peaks = torch.tensor(trainer.memory.finish(), dtype=torch.float64)
    peaks = hvd.allreduce(peaks, op=hvd.Max)
    hosts = hvd.allgather_object(metrics.hostname())
    # After the timed epochs and the memory peaks; in none of their figures.
    if hvd.size() > 1:
        info = data.info(spec.dataset)
        replica = models.build(spec.model, info.shape, info.num_classes)
        order = torch.randperm(len(trainer.train_y), generator=torch.Generator().manual_seed(0))
        b = spec.global_batch_size // hvd.size()
        rec.communication = measure_exposed_communication(
            "replica", rec.epochs, replica.to(device), make_optimizer(spec, replica.parameters()),
            batches_of(trainer.train_x, trainer.train_y, order.to(device), b), device,
            trainer.dtype, trainer.scaler,
        )  # fmt: skip
    energy_t = hvd.allreduce(torch.tensor([energy or 0.0, utilization or 0.0]), op=hvd.Sum)
    if cuda:
        energy, utilization = energy_t[0].item(), energy_t[1].item() / hvd.size()
    save = os.environ.get("TRAINSCALE_SAVE_WEIGHTS")  # final weights, for equivalence tests
    if save and "{rank}" in save:  # every rank's ({strategy}, {rank} filled in), to compare
        torch.save(trainer.net.state_dict(), save.format(rank=hvd.rank(), strategy=spec.strategy))
    if hvd.rank() == 0:
        env = metrics.environment(
            rec.start_utc, {"torch": torch.__version__, "horovod": horovod.__version__}, hosts
        )
        env["cuda"] = torch.version.cuda if cuda else None
        env["driver"] = metrics.driver_version() if cuda else None
        hv = {"timeline": os.environ.get("HOROVOD_TIMELINE"), "final_world_size": hvd.size()}
        if elastic:
            hv["membership"] = membership
        result = rec.record(
            model={"params": models.param_count(trainer.net)},
            data={"train_samples": trainer.train_samples, "test_samples": len(trainer.test_y)},
            test=dict(trainer.test),
            memory=memory_block(peaks.tolist(), cuda),
            device={
                "kind": device.type,
                "name": torch.cuda.get_device_name(device) if cuda else metrics.cpu_name(),
                "count": hvd.size(),
                "utilization_mean": utilization,
                "energy_joules": energy,
            },
            env=env,
            oversubscribed=check_oversubscribed(spec.workers, spec.threads_per_worker),
            launch=metrics.launch_info(),
            horovod=hv,
        )
        metrics.write(out, result)
        if save and "{rank}" not in save:
            torch.save(trainer.net.state_dict(), save)
        print(
            f"trainscale: ok, throughput {fmt_rate(result['throughput'])} samples/s, "
            f"test accuracy {result['test']['accuracy']}; wrote {out}",
            flush=True,
        )
    hvd.shutdown()

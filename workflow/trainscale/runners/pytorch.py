"""PyTorch: one process (`torch`), nn.DataParallel (`torch-dp`), DistributedDataParallel
(`torch-ddp`) and fully sharded data parallelism (`torch-fsdp`, FSDP2 `fully_shard` over the
model's blocks); the last two launched by torchrun, gloo on CPU, NCCL on GPU.

One loop for all four, in the style of PyTorch's DDP tutorial: rank from torchrun's
environment, DistributedSampler shards, rank 0 writes. Every rank runs the same number of
steps, so no rank ever waits in a collective for one that stopped on its own clock.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from trainscale import catalog, data, metrics, models
from trainscale.matrix import RunSpec
from trainscale.memory import PhasePeaks, memory_block
from trainscale.runners.common import (
    check_oversubscribed,
    check_steps,
    detect_rank,
    evaluates,
    fmt_rate,
    maybe_fault,
    steps_per_epoch,
)
from trainscale.runners.exposed import batches_of, measure_exposed_communication

# DDP warns when a 1-input-channel conv's weight gradient has other strides than its bucket
# view; it costs one small copy per step, and the message would fill every log.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: strategies that run one process per worker under torchrun
DISTRIBUTED = catalog.names(runner="pytorch", one_process=False)


def shard(net: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    """FSDP2: every top-level block with parameters is one shard unit (its parameters are
    all-gathered just before it runs and freed after), the root takes the rest. `precision`
    becomes the policy: parameters and compute in `dtype`, gradients reduced in fp32 so the
    update matches DDP's; the optimizer keeps fp32 shards."""
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    for block in models.blocks(net):
        if any(True for _ in block.parameters()):
            fully_shard(block, mp_policy=policy)
    fully_shard(net, mp_policy=policy)
    return net


def leave() -> None:
    """End a torchrun worker once every rank is done, without the process-group teardown.

    Tearing down a gloo group can deadlock at exit: a gloo worker thread frees the last
    collective's tensors while holding the group's lock and waits for the GIL, while the main
    thread holds the GIL and waits for that lock in ~ProcessGroupGloo (seen here as 2-rank
    runs hanging after their metrics were written). The results are written; leave."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sync(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock time covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(distributed: bool, device: torch.device) -> None:
    sync(device)
    if distributed:
        dist.barrier()


def phase_peaks(device: torch.device) -> PhasePeaks:
    """Training's and evaluation's peak memory apart: host RSS, and allocated device memory on
    a GPU (torch's peak counter, reset with the host's at every evaluation's start and end)."""
    if device.type != "cuda":
        return PhasePeaks()
    return PhasePeaks(
        lambda: torch.cuda.max_memory_allocated(device),
        lambda: torch.cuda.reset_peak_memory_stats(device),
    )


def to_tensors(arrays: data.Arrays, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Normalised float32 images and int64 labels, held in memory (on the GPU if there is one)
    so that feeding a step is one index operation, never a bottleneck."""
    mean = torch.tensor(arrays.mean).view(1, -1, 1, 1)
    std = torch.tensor(arrays.std).view(1, -1, 1, 1)

    def images(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x).float().div_(arrays.x_max).sub_(mean).div_(std)
        return t.to(device)

    return (
        images(arrays.train_x),
        torch.from_numpy(arrays.train_y).to(device),
        images(arrays.test_x),
        torch.from_numpy(arrays.test_y).to(device),
    )


def make_optimizer(spec: RunSpec, params) -> torch.optim.Optimizer:
    if spec.optimizer == "adam":
        return torch.optim.Adam(
            params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
        )
    return torch.optim.SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
    )


class _Indexable:
    """A length for DistributedSampler: the training set replicated `scale` times."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    rank: int,
    world: int,
    dist_on: bool,
    batch: int,
    input_dtype: torch.dtype | None = None,
) -> tuple[float, float]:
    """Test accuracy and mean loss; each rank scores its stride of the test set in batches of
    the training's per-worker batch (so evaluation needs no more memory than a step), then sum.

    Every rank runs the same number of equal-sized forward passes (the last stride is padded
    with a repeated sample that is not counted), because with sharded parameters (ZeRO-3,
    FSDP) each forward is a collective that all ranks must join.
    """
    model.eval()
    n = len(y)
    per_rank = -(-n // world)
    idx = rank + world * torch.arange(per_rank, device=y.device)
    counted = (idx < n).double()
    idx = idx.clamp(max=n - 1)
    totals = torch.zeros(3, dtype=torch.float64, device=x.device)  # correct, loss sum, count
    for i in range(0, per_rank, batch):
        sel, w = idx[i : i + batch], counted[i : i + batch]
        xb = x[sel] if input_dtype is None else x[sel].to(input_dtype)
        out = model(xb).float()
        totals[0] += ((out.argmax(1) == y[sel]).double() * w).sum()
        totals[1] += (F.cross_entropy(out, y[sel], reduction="none").double() * w).sum()
        totals[2] += w.sum()
    if dist_on:
        dist.all_reduce(totals)
    model.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


@record
def main(spec: RunSpec, out: str) -> None:
    rec = metrics.Recorder(spec.to_dict())
    rk = detect_rank()
    torch.set_num_threads(spec.threads_per_worker)
    distributed = spec.strategy in DISTRIBUTED
    fsdp = spec.strategy == "torch-fsdp"
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{rk.local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend=backend, device_id=device if cuda else None)
    if spec.strategy == "torch-dp" and spec.workers > max(1, torch.cuda.device_count()):
        raise RuntimeError(
            f"torch-dp with workers={spec.workers} needs {spec.workers} GPUs, "
            f"found {torch.cuda.device_count()}"
        )

    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
    train_x, train_y, test_x, test_y = to_tensors(arrays, device)
    n = len(train_y)
    train_samples = n * spec.scale

    torch.manual_seed(spec.seed)  # same fresh initial weights on every rank and every repeat
    net = models.build(spec.model, arrays.info.shape, arrays.info.num_classes).to(device)
    dtype = DTYPES[spec.precision]
    if fsdp:
        model: torch.nn.Module = shard(net, dtype)
        dtype = None  # FSDP casts parameters and inputs itself: no autocast
    elif distributed:
        model = DDP(net, device_ids=[device.index] if cuda else None)
    elif spec.strategy == "torch-dp":
        model = torch.nn.DataParallel(net, device_ids=list(range(spec.workers)) if cuda else None)
    else:
        model = net
    opt = make_optimizer(spec, model.parameters())
    scaler = torch.amp.GradScaler(device.type, enabled=spec.precision == "fp16")

    sampler = DistributedSampler(
        _Indexable(train_samples),
        num_replicas=rk.world_size,
        rank=rk.rank,
        shuffle=True,
        seed=spec.seed,
        drop_last=True,
    )
    b = spec.per_worker_batch_size
    steps = steps_per_epoch(train_samples, rk.world_size, b, spec.steps_per_epoch)
    check_steps(steps, spec.path, train_samples, spec.global_batch_size)
    uuid = torch.cuda.get_device_properties(device).uuid if cuda else None
    gpu = metrics.GpuMonitor(
        read=metrics.GpuMonitor.nvml_reader(device.index, uuid) if cuda else None
    )
    memory = phase_peaks(device)
    model.train()
    rec.training_starts()
    gpu.start()
    test_acc = test_loss = None
    for epoch in range(1, spec.epochs + 1):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), device=device) % n  # this rank's shard, scale folded
        loss_sum = torch.zeros((), device=device)
        step_seconds = []
        barrier(distributed, device)
        t_epoch = time.perf_counter()
        for step in range(steps):
            if step == steps // 2:
                maybe_fault(spec, rk.rank, epoch)
            t_step = time.perf_counter()
            idx = order[step * b : (step + 1) * b]
            x, y = train_x[idx], train_y[idx]
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(model(x).float(), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            loss_sum += loss.detach().float()
            sync(device)
            step_seconds.append(time.perf_counter() - t_step)
        barrier(distributed, device)
        seconds = time.perf_counter() - t_epoch
        if distributed:
            dist.all_reduce(loss_sum)
        train_loss = (loss_sum / (steps * rk.world_size)).item()
        scored = evaluates(spec, arrays.info.synthetic, epoch)
        if scored:
            memory.evaluation_starts()
            test_acc, test_loss = evaluate(
                net, test_x, test_y, rk.rank, rk.world_size, distributed, b
            )
            memory.evaluation_ends()
        e = rec.epoch(
            seconds,
            samples=steps * spec.global_batch_size,
            steps=steps,
            train_loss=train_loss,
            step_seconds=step_seconds,
            test_accuracy=test_acc if scored else None,
            test_loss=test_loss if scored else None,
        )
        if rk.is_main:
            print(
                f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, "
                f"{fmt_rate(e['samples_per_second'])} samples/s, loss {train_loss:.4f}",
                flush=True,
            )
    utilization, energy = gpu.stop()

    # Peak memory per rank (and its max), utilisation and energy; host names of all ranks.
    peaks = torch.tensor(memory.finish(), dtype=torch.float64, device=device)
    hosts = [metrics.hostname()]
    per_rank = peaks.view(1, 4)
    if distributed:
        gathered = [torch.zeros_like(peaks) for _ in range(rk.world_size)]
        dist.all_gather(gathered, peaks)
        per_rank = torch.stack(gathered)
        peaks = per_rank.max(0).values
        hosts_all: list = [None] * rk.world_size
        dist.all_gather_object(hosts_all, hosts[0])
        hosts = hosts_all
        energy_t = torch.tensor([energy or 0.0, utilization or 0.0], device=device)
        dist.all_reduce(energy_t)
        if cuda:
            energy, utilization = energy_t[0].item(), energy_t[1].item() / rk.world_size
    # After the timed epochs and the memory peaks; in none of their figures.
    if distributed and rk.world_size > 1:
        rec.communication = measure_exposed_communication(
            "fsdp" if fsdp else "ddp", rec.epochs, model, opt,
            batches_of(train_x, train_y, order, b), device, dtype, scaler,
        )  # fmt: skip
    weights_path = os.environ.get("TRAINSCALE_SAVE_WEIGHTS")  # final weights, for tests
    weights = None
    if weights_path:  # FSDP's full state dict is a collective: every rank takes part
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(net, options=full) if fsdp else net.state_dict()

    if rk.is_main:
        env = metrics.environment(rec.start_utc, {"torch": torch.__version__}, hosts)
        env["cuda"] = torch.version.cuda if cuda else None
        env["driver"] = metrics.driver_version() if cuda else None
        result = rec.record(
            model={"params": models.param_count(net)},
            data={"train_samples": train_samples, "test_samples": len(test_y)},
            test={"accuracy": test_acc, "loss": test_loss},
            memory={
                **memory_block(peaks.tolist(), cuda),
                "per_rank_host_rss_bytes": [int(v) for v in per_rank[:, 0].tolist()],
                "per_rank_device_bytes": [int(v) for v in per_rank[:, 1].tolist()]
                if cuda
                else None,
            },
            device={
                "kind": device.type,
                "name": torch.cuda.get_device_name(device) if cuda else metrics.cpu_name(),
                "count": spec.world_size if distributed else spec.workers,
                "utilization_mean": utilization,
                "energy_joules": energy,
            },
            env=env,
            oversubscribed=check_oversubscribed(spec.workers, spec.threads_per_worker),
            launch=metrics.launch_info(),
        )
        metrics.write(out, result)
        if weights_path:
            torch.save(weights, weights_path)
        print(
            f"trainscale: ok, throughput {fmt_rate(result['throughput'])} samples/s, "
            f"test accuracy {result['test']['accuracy']}; wrote {out}",
            flush=True,
        )
    if distributed:
        leave()

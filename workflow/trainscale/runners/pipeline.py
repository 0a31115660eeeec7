"""torch-pipeline: pipeline (model) parallelism with `torch.distributed.pipelining`, one stage
per worker, launched by torchrun (gloo on CPU, NCCL on GPU).

The model's top-level blocks (`models.blocks`) are cut into `world_size` contiguous stages
with the most even parameter counts (`split`). Each rank builds the whole model from the run's
seed, so every stage starts from the weights one process would have, keeps its own blocks and
frees the rest (its peak RSS therefore includes the full fp32 model once; on GPU only the stage
moves to the device). There is no data parallelism: every rank walks the same data order, the
first stage feeds the images, the last the labels. Each global batch is split into
`microbatches` equal micro-batches; the schedule (`pipeline_schedule`: GPipe runs all forwards
then all backwards, 1F1B alternates them in steady state) orders them, and gradients are
averaged over micro-batches (scale_grads), so one step is one full-batch step. Precision bf16
runs the stages under autocast; fp16 is dropped by the matrix (its loss scaler would have to
agree on skipped steps across stages).
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.utils.data.distributed import DistributedSampler

from trainscale import data, metrics, models
from trainscale.matrix import RunSpec
from trainscale.memory import memory_block
from trainscale.runners.common import (
    check_oversubscribed,
    check_steps,
    detect_rank,
    evaluates,
    fmt_rate,
    maybe_fault,
    steps_per_epoch,
)
from trainscale.runners.pytorch import (
    DTYPES,
    _Indexable,
    barrier,
    leave,
    make_optimizer,
    phase_peaks,
    sync,
    to_tensors,
)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def split(sizes: list[int], stages: int) -> list[tuple[int, int]]:
    """Cut blocks with these parameter counts into `stages` contiguous, non-empty [lo, hi)
    ranges whose largest parameter sum is as small as it can be (exact, by dynamic
    programming; ties go to the earliest cut). Parameters are what a stage must hold."""
    n = len(sizes)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} blocks into {stages} non-empty stages")
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    # best[k][i]: smallest max-stage sum cutting the first i blocks into k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    bounds, i = [], n
    for k in range(stages, 0, -1):
        bounds.append((cut[k][i], i))
        i = cut[k][i]
    return bounds[::-1]


@torch.no_grad()
def evaluate(
    schedule, stage_mod: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, rank: int
) -> tuple[float, float]:
    """Test accuracy and mean loss through the pipeline, forward only, in batches of the
    training batch size (so micro-batch shapes match the ones the stages were set up with);
    the last batch is padded with a repeated sample that is not counted."""
    stage_mod.eval()
    first, last = rank == 0, rank == dist.get_world_size() - 1
    n = len(y)
    totals = torch.zeros(3, dtype=torch.float64, device=y.device)  # correct, loss sum, count
    for i in range(0, n, batch):
        idx = torch.arange(i, i + batch, device=y.device)
        counted = (idx < n).double()
        idx = idx.clamp(max=n - 1)
        args = (x[idx],) if first else ()
        out = schedule.eval(*args, target=y[idx] if last else None)  # the loss_fn needs one
        if last:
            out = out.float()
            totals[0] += ((out.argmax(1) == y[idx]).double() * counted).sum()
            totals[1] += (F.cross_entropy(out, y[idx], reduction="none").double() * counted).sum()
            totals[2] += counted.sum()
    dist.all_reduce(totals)  # only the last stage's are non-zero
    stage_mod.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


@record
def main(spec: RunSpec, out: str) -> None:
    rec = metrics.Recorder(spec.to_dict())
    rk = detect_rank()
    torch.set_num_threads(spec.threads_per_worker)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{rk.local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=device if cuda else None)
    first, last = rk.rank == 0, rk.rank == rk.world_size - 1

    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
    train_x, train_y, test_x, test_y = to_tensors(arrays, device)
    n = len(train_y)
    train_samples = n * spec.scale

    torch.manual_seed(spec.seed)  # the weights one process would start from, on every rank
    net = models.build(spec.model, arrays.info.shape, arrays.info.num_classes)
    params = models.param_count(net)
    blocks = models.blocks(net)
    bounds = split([models.param_count(b) for b in blocks], rk.world_size)
    lo, hi = bounds[rk.rank]
    stage_mod = nn.Sequential(*blocks[lo:hi]).to(device)
    del net, blocks
    stage = PipelineStage(stage_mod, rk.rank, rk.world_size, device)
    schedule = SCHEDULES[spec.pipeline_schedule](
        stage, spec.microbatches, loss_fn=lambda o, t: F.cross_entropy(o.float(), t)
    )
    opt = make_optimizer(spec, stage_mod.parameters())
    dtype = DTYPES[spec.precision]

    sampler = DistributedSampler(  # one data-parallel replica: every stage sees every batch
        _Indexable(train_samples), num_replicas=1, rank=0, shuffle=True, seed=spec.seed
    )
    b = spec.global_batch_size
    steps = steps_per_epoch(train_samples, 1, b, spec.steps_per_epoch)
    check_steps(steps, spec.path, train_samples, b)
    memory = phase_peaks(device)
    stage_mod.train()
    rec.training_starts()
    test_acc = test_loss = None
    microbatch_losses: list[float] = []  # last stage, for the equivalence test
    for epoch in range(1, spec.epochs + 1):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), device=device) % n
        loss_sum = torch.zeros((), device=device)
        step_seconds = []
        barrier(True, device)
        t_epoch = time.perf_counter()
        for step in range(steps):
            if step == steps // 2:
                maybe_fault(spec, rk.rank, epoch)
            t_step = time.perf_counter()
            idx = order[step * b : (step + 1) * b]
            losses: list[torch.Tensor] = []
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                args = (train_x[idx],) if first else ()
                target = train_y[idx] if last else None
                schedule.step(*args, target=target, losses=losses if last else None)
            opt.step()
            if last:
                mb = torch.stack([v.detach().float() for v in losses])
                loss_sum += mb.sum()
                microbatch_losses += mb.tolist()
            sync(device)
            step_seconds.append(time.perf_counter() - t_step)
        barrier(True, device)
        seconds = time.perf_counter() - t_epoch
        dist.all_reduce(loss_sum)  # only the last stage's is non-zero
        train_loss = (loss_sum / (steps * spec.microbatches)).item()
        evaluated = evaluates(spec, arrays.info.synthetic, epoch)
        if evaluated:
            memory.evaluation_starts()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                test_acc, test_loss = evaluate(schedule, stage_mod, test_x, test_y, b, rk.rank)
            memory.evaluation_ends()
        e = rec.epoch(
            seconds,
            samples=steps * b,
            steps=steps,
            train_loss=train_loss,
            step_seconds=step_seconds,
            test_accuracy=test_acc if evaluated else None,
            test_loss=test_loss if evaluated else None,
        )
        if rk.is_main:
            print(
                f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, "
                f"{fmt_rate(e['samples_per_second'])} samples/s, loss {train_loss:.4f}",
                flush=True,
            )

    peaks = torch.tensor(memory.finish(), dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(peaks) for _ in range(rk.world_size)]
    dist.all_gather(gathered, peaks)
    per_rank = torch.stack(gathered)
    peaks = per_rank.max(0).values
    hosts: list = [None] * rk.world_size
    dist.all_gather_object(hosts, metrics.hostname())
    stage_params = [None] * rk.world_size
    dist.all_gather_object(stage_params, models.param_count(stage_mod))
    weights_path = os.environ.get("TRAINSCALE_SAVE_WEIGHTS")  # final weights, for tests
    if weights_path:  # the full model's state dict, keys as models.build names them
        local = {
            f"{lo + int(k.split('.', 1)[0])}.{k.split('.', 1)[1]}": v.detach().cpu()
            for k, v in stage_mod.state_dict().items()
        }
        parts: list = [None] * rk.world_size
        dist.all_gather_object(parts, local)
    losses_path = os.environ.get("TRAINSCALE_SAVE_LOSSES")  # per-micro-batch losses, for tests
    if losses_path and last:
        with open(losses_path, "w") as f:
            json.dump(microbatch_losses, f)

    if rk.is_main:
        env = metrics.environment(rec.start_utc, {"torch": torch.__version__}, hosts)
        env["cuda"] = torch.version.cuda if cuda else None
        env["driver"] = metrics.driver_version() if cuda else None
        result = rec.record(
            model={"params": params},
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
                "count": spec.world_size,
                "utilization_mean": None,
                "energy_joules": None,
            },
            env=env,
            oversubscribed=check_oversubscribed(spec.workers, spec.threads_per_worker),
            launch=metrics.launch_info(),
            pipeline={
                "schedule": spec.pipeline_schedule,
                "microbatches": spec.microbatches,
                "microbatch_size": b // spec.microbatches,
                "stages": [list(r) for r in bounds],
                "stage_params": stage_params,
            },
        )
        metrics.write(out, result)
        if weights_path:
            torch.save({k: v for part in parts for k, v in part.items()}, weights_path)
        print(
            f"trainscale: ok, throughput {fmt_rate(result['throughput'])} samples/s, "
            f"test accuracy {result['test']['accuracy']}; wrote {out}",
            flush=True,
        )
    leave()

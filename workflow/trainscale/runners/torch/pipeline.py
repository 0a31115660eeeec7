"""torch-pipeline: pipeline (model) parallelism with `torch.distributed.pipelining`, one stage
per worker, launched by torchrun (gloo on CPU, NCCL on GPU); a plug-in on the PyTorch loop
(torch_loop.py), which trains, times and records it.

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

from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from trainscale.data.imagedata import resize_batch
from trainscale.models import torch_models as models
from trainscale.plan.matrix import RunSpec
from trainscale.runners.torch.plugin import Plugin
from trainscale.runners.torch.torch_loop import run
from trainscale.runners.torch.torch_parts import loss_of, scored, tally, totals_size
from trainscale.runners.torch.torch_speed import compiled

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


def padded(
    x: torch.Tensor, y: torch.Tensor, batch: int, image_size: tuple[int, int] | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A test set's (x, y, counted) in batches of exactly `batch` (the micro-batch shapes the
    stages were set up with): the last one padded with a repeated sample that is not counted."""
    n = len(y)
    for i in range(0, n, batch):
        idx = torch.arange(i, i + batch, device=y.device)
        counted = (idx < n).double()
        idx = idx.clamp(max=n - 1)
        yield resize_batch(x[idx], image_size), y[idx], counted


@torch.no_grad()
def evaluate(
    schedule, stage_mod: nn.Module, batches: Iterable, rank: int, classes: int,
    device: torch.device, tokens: bool = False,
) -> dict:  # fmt: skip
    """Test accuracy, mean loss and confusion (per token on token data) through the pipeline,
    forward only, over `padded` batches: the first stage feeds x, the last scores y."""
    stage_mod.eval()
    first, last = rank == 0, rank == dist.get_world_size() - 1
    totals = torch.zeros(totals_size(classes, tokens), dtype=torch.float64, device=device)
    for x, y, counted in batches:
        out = schedule.eval(*((x,) if first else ()), target=y if last else None)  # loss_fn's
        if last:
            tally(totals, out.float(), y, counted)
    dist.all_reduce(totals)  # only the last stage's are non-zero
    stage_mod.train()
    return scored(totals, classes, tokens)


class Contiguous(nn.Module):
    """The activations a stage sends, made contiguous: torch.distributed sends only contiguous
    tensors, and a block may end in a view (a user's patch embedding's transpose)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous()


def tied_groups(blocks: list[nn.Module], bounds: list[tuple[int, int]], rank: int) -> list:
    """[(parameter, process group)] of the parameters this stage shares with another stage (a
    GPT's token embedding, which its head reuses). Every rank builds the same groups (a
    collective); the stages holding a copy sum its gradient over them before each update, as
    Megatron-LM's embedding group does, so the copies take the same steps and stay tied."""
    stage_of = {i: r for r, (lo, hi) in enumerate(bounds) for i in range(lo, hi)}
    holders: dict[int, tuple[nn.Parameter, set[int]]] = {}
    for i, block in enumerate(blocks):
        for param in block.parameters():
            holders.setdefault(id(param), (param, set()))[1].add(stage_of[i])
    out = []
    for param, stages in holders.values():
        if len(stages) > 1:
            group = dist.new_group(sorted(stages))
            if rank in stages:
                out.append((param, group))
    return out


class Pipeline(Plugin):
    """Every rank builds the whole model from the seed, keeps its stage and walks every batch;
    the first stage feeds the images, the last the labels and the loss."""

    batch_of = "global"

    def connect(self, device: torch.device) -> None:
        if device.type == "cuda" and self.loop.backend != "nccl":
            # seen on an H100 (docs/gpu-validation.md): gloo's TCP transport writes the CUDA
            # pointer itself ("writev ...: Bad address"), and NCCL refuses two ranks on one GPU
            raise RuntimeError(
                f"torch-pipeline: {self.loop.rk.local_world_size} stages share "
                f"{torch.cuda.device_count()} GPU(s) on this node; a stage needs a GPU of its "
                "own (its activations go GPU to GPU over NCCL, and gloo cannot send CUDA "
                "tensors point to point): use workers up to the node's GPUs"
            )
        super().connect(device)

    def wrap(self, net: nn.Module) -> None:
        lp, rk = self.loop, self.loop.rk
        self.first, self.last = rk.rank == 0, rk.rank == rk.world_size - 1
        blocks = models.blocks(net, self.spec.own_model)
        self.bounds = split([models.param_count(b) for b in blocks], rk.world_size)
        self.lo, hi = self.bounds[rk.rank]
        self.tied = tied_groups(blocks, self.bounds, rk.rank)
        sent = [] if self.last else [Contiguous()]  # what a stage sends must be contiguous
        self.stage_mod = nn.Sequential(*blocks[self.lo : hi], *sent).to(lp.device)
        del net, blocks
        stage_net = compiled(self.stage_mod, self.spec)
        stage = PipelineStage(stage_net, rk.rank, rk.world_size, lp.device)
        self.schedule = SCHEDULES[self.spec.pipeline_schedule](
            stage, self.spec.microbatches, loss_fn=lambda o, t: loss_of(o.float(), t)
        )
        self.opt = lp.make_optimizer(self.stage_mod.parameters())
        self.stage_mod.train()

    def losses_per_step(self) -> int:
        return self.spec.microbatches  # only the last stage's losses are summed

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        lp, dtype = self.loop, self.dtype
        losses: list[torch.Tensor] = []
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(lp.device.type, dtype=dtype, enabled=dtype is not None):
            args = (x,) if self.first else ()
            target = y if self.last else None
            self.schedule.step(*args, target=target, losses=losses if self.last else None)
        for param, group in self.tied:  # a tied embedding's copies on the first and last stage
            dist.all_reduce(param.grad, group=group)
        self.opt.step()
        if not self.last:
            return torch.zeros((), device=lp.device)
        return torch.stack([v.detach().float() for v in losses]).sum()

    def evaluate(self, batch: int) -> dict:
        lp, dtype = self.loop, self.dtype
        if lp.tokens:
            windows = lp.test_loader.epoch(1)  # in order; every stage walks the same
            x, y = (torch.cat(t).to(lp.device) for t in zip(*windows, strict=True))
            batches = padded(x, y, batch)
        else:
            batches = padded(lp.test_x, lp.test_y, batch, lp.spec.image_size)
        with torch.autocast(lp.device.type, dtype=dtype, enabled=dtype is not None):
            return evaluate(
                self.schedule, self.stage_mod, batches, lp.rk.rank, lp.info.num_classes,
                lp.device, lp.tokens,
            )  # fmt: skip

    def finish(self) -> None:
        stage_params = self.gather_object(models.param_count(self.stage_mod))
        self.extra_blocks = {
            "pipeline": {
                "schedule": self.spec.pipeline_schedule,
                "microbatches": self.spec.microbatches,
                "microbatch_size": self.spec.global_batch_size // self.spec.microbatches,
                "stages": [list(r) for r in self.bounds],
                "stage_params": stage_params,
            }
        }


def main(spec: RunSpec, out: str) -> None:
    run(Pipeline, spec, out)

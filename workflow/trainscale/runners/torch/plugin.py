"""A strategy on the PyTorch loop (torch_loop.py): the `Plugin` a strategy's module subclasses,
with the defaults of torchrun and torch.distributed, and the `Shard` of data one epoch gives a
rank. The loop calls the plug-in to join its process group, wrap the model, step, score and
tear down; everything timed and recorded stays the loop's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

from trainscale.runners.common import Rank, detect_rank
from trainscale.runners.torch.torch_parts import (
    DTYPES,
    Indexable,
    SkippedSteps,
    evaluate,
    leave,
    loss_of,
)

if TYPE_CHECKING:
    from trainscale.runners.torch.torch_loop import Loop


class Shard(NamedTuple):
    """One epoch's data for this rank: sample indices (scale folded; None on user data, whose
    loader draws the order), the rank's batch, the steps every rank takes and the samples one
    step trains over all ranks."""

    order: torch.Tensor | None
    batch: int
    steps: int
    step_samples: int


class Plugin:
    """A strategy on the loop. The defaults are torchrun's with torch.distributed (gloo on
    CPU, NCCL on GPU) and a plain autocast + GradScaler step of `self.model`; a plug-in
    overrides what its framework does differently."""

    #: one process per worker in a process group (False: one process, no collectives)
    grouped = True
    #: data-parallel replicas' share of the global batch: "worker" (per-worker batch) or
    #: "global" (every rank walks every batch, as a pipeline's stages do)
    batch_of = "worker"

    def __init__(self, loop: Loop) -> None:
        self.loop, self.spec = loop, loop.spec
        self.dtype = DTYPES[self.spec.precision]
        self.frameworks: dict[str, str] = {}
        self.extra_blocks: dict = {}  # record blocks the plug-in adds (pipeline, deepspeed...)
        self.extra_memory: dict = {}  # entries it adds to the memory block
        self.env_extra: dict = {}  # entries it adds to the env block (tensor parallel: mesh)
        self.skips = SkippedSteps()  # fp16 steps the GradScaler skipped

    # --- the process group -----------------------------------------------------------------
    def rank(self) -> Rank:
        return detect_rank()

    def connect(self, device: torch.device) -> None:
        if self.grouped:
            nccl = self.loop.backend == "nccl"
            dist.init_process_group(self.loop.backend, device_id=device if nccl else None)

    def barrier(self) -> None:
        if self.grouped:
            dist.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.grouped:
            dist.all_reduce(t)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t`, stacked in rank order."""
        if not self.grouped:
            return t.unsqueeze(0)
        parts = [torch.zeros_like(t) for _ in range(self.loop.rk.world_size)]
        dist.all_gather(parts, t)
        return torch.stack(parts)

    def gather_object(self, obj: object) -> list:
        if not self.grouped:
            return [obj]
        out: list = [None] * self.loop.rk.world_size
        dist.all_gather_object(out, obj)
        return out

    def data_rank(self) -> tuple[int, int]:
        """(this rank's data-parallel replica, replicas): which share of each epoch's samples
        it feeds. A rank is a replica of its own; where every rank walks every batch (a
        pipeline's stages) all are one."""
        if self.batch_of == "worker":
            return self.loop.rk.rank, self.loop.rk.world_size
        return 0, 1

    @property
    def world_size(self) -> int:
        return self.loop.rk.world_size

    @property
    def device_count(self) -> int:
        return self.spec.world_size

    # --- the model and its step ------------------------------------------------------------
    #: how the model was built, for the record's `model.build`: "whole" on every rank, "meta"
    #: (sharded before any rank held it), "zero.Init" (partitioned as each module is built)
    built = "whole"

    def build(self) -> torch.nn.Module:
        """The run's model, freshly initialised: whole, by default (Loop.build_model)."""
        return self.loop.build_model()

    def wrap(self, net: torch.nn.Module) -> None:
        """Make `self.model` (what steps), `self.eval_model` (what is scored) and `self.opt`
        from the freshly seeded model `net`."""
        raise NotImplementedError

    def shard(self, epoch: int) -> Shard:
        lp = self.loop
        if lp.loader is not None:  # user data: the loader's sampler or shards order it
            return Shard(None, lp.batch, lp.steps, self.spec.global_batch_size)
        rank, replicas = self.data_rank()
        sampler = DistributedSampler(
            Indexable(lp.train_samples), num_replicas=replicas, rank=rank, shuffle=True,
            seed=self.spec.seed, drop_last=True,
        )  # fmt: skip
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), device=lp.device) % lp.n
        return Shard(order, lp.batch, lp.steps, self.spec.global_batch_size)

    #: losses one step adds to the summed loss over all ranks (the epoch's mean divides by it):
    #: one per rank and micro-batch (grad_accum)
    def losses_per_step(self) -> int:
        return self.world_size * self.spec.grad_accum

    def epoch_starts(self, epoch: int) -> None:
        """Called before each epoch's order is drawn (DeepSpeed starts its breakdown here)."""

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on this batch (on the device): the gradients of `grad_accum`
        micro-batches of it accumulated, synchronised once, at the last (`no_sync`). Returns
        the detached sum of the micro-batches' losses (a 0-d tensor, not read here: reading it
        would wait for the device every step)."""
        k = self.spec.grad_accum
        self.opt.zero_grad(set_to_none=True)
        if k == 1:
            loss = self.backward(x, y)
        else:
            micro = list(zip(x.tensor_split(k), y.tensor_split(k), strict=True))
            with self.no_sync():
                loss = sum(self.backward(xm, ym, len(ym) / len(y) * k) for xm, ym in micro[:-1])
            loss = loss + self.backward(*micro[-1], len(micro[-1][1]) / len(y) * k)
        if self.scaler.is_enabled():
            with self.skips.counting(self.scaler):
                self.scaler.step(self.opt)
                self.scaler.update()
        else:
            self.opt.step()
        return loss

    def backward(self, x: torch.Tensor, y: torch.Tensor, share: float = 1.0) -> torch.Tensor:
        """Forward and backward of one (micro-)batch; its gradients count `share` / grad_accum
        of the step's. Returns its detached loss times `share`."""
        if self.dtype is None:  # no autocast context to enter (it costs per step); FSDP's
            loss = loss_of(self.model(x).float(), y)  # policy may still cast
        else:
            with torch.autocast(self.loop.device.type, dtype=self.dtype):
                loss = loss_of(self.model(x).float(), y)
        if share != 1.0:
            loss = loss * share
        weighted = loss / self.spec.grad_accum if self.spec.grad_accum > 1 else loss
        (self.scaler.scale(weighted) if self.scaler.is_enabled() else weighted).backward()
        return loss.detach()

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Gradient synchronisation off for the micro-batches before a step's last: DDP's
        `no_sync()`, FSDP2's `set_requires_gradient_sync(False)`; nothing for a model whose
        gradients no collective reduces (one process, tensor parallelism alone)."""
        if hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        if hasattr(self.model, "set_requires_gradient_sync"):
            return _without_gradient_sync(self.model)
        return contextlib.nullcontext()

    def replica_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the data-parallel replicas (each rank is one): what evaluation adds
        up, since the replicas score disjoint test batches."""
        return self.all_sum(t)

    def evaluate(self, batch: int) -> dict:
        """The `test` block's accuracy, loss and confusion (torch_parts.evaluate)."""
        lp = self.loop
        return evaluate(
            self.eval_model, lp.test_batches(batch), lp.device, lp.info.num_classes,
            self.replica_sum, getattr(self, "input_dtype", None), lp.tokens,
        )  # fmt: skip

    # --- after the epochs ------------------------------------------------------------------
    def train(self) -> None:
        """Every epoch, in order, until the loss diverges (Horovod elastic runs them under its
        own driver)."""
        for epoch in range(1, self.spec.epochs + 1):
            if self.loop.epoch(epoch) is None:
                return

    def skipped_steps(self) -> int | None:
        """Steps fp16's loss scaling skipped (torch_parts.SkippedSteps); None without it."""
        return self.skips.total() if self.spec.precision == "fp16" else None

    def exposed(self, shard: Shard) -> dict | None:
        """The `communication` block (exposed.py), or None where there is none."""
        return None

    def finish(self) -> None:
        """Fill `extra_blocks`/`extra_memory` (on every rank: may be a collective)."""

    def teardown(self) -> None:
        if self.grouped:
            leave()


@contextlib.contextmanager
def _without_gradient_sync(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2: no reduce-scatter of gradients inside, as torchtitan accumulates micro-batches."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)

"""Exposed communication: how much of a multi-worker step is communication that the step waits
for, measured rather than modelled.

After the timed epochs (their evaluation and the memory peaks) every multi-worker
PyTorch-family run takes as many extra optimizer steps as its steady epochs timed, at least
`MIN_STEPS` and at most `STEPS`, with gradient synchronisation off, on
the same batches, timed on rank 0 like the epochs' steps (device synchronised) and counted in
no epoch or throughput figure. The weights and optimizer state are restored afterwards, so
the run ends with the weights its epochs trained.
Definitions (the `communication` block of metrics.json):

- compute_seconds_per_step: the median of rank 0's wall seconds over the no-sync steps.
- step_seconds_per_step: the mean over the steady epochs (2..E) of rank 0's median step time
  (their `step_seconds_p50`): the synchronised step it is compared with.
- exposed_seconds_per_step: max(0, step − compute): the part of a step spent waiting for
  communication that computation did not hide.
- method: how synchronisation was switched off: `ddp-no_sync` (DDP's `no_sync()`: no bucket
  all-reduce), `fsdp-no-gradient-sync` (FSDP2 `set_requires_gradient_sync(False)`: no
  reduce-scatter; its parameter all-gathers still run, and the optimizer step finds no sharded
  gradient, so this compute leaves the optimizer out), `local-replica` (DeepSpeed ZeRO and
  Horovod, which have no switch that leaves their step intact: DeepSpeed's `no_sync()` refuses
  ZeRO-2/3 and forbids `step()`, and Horovod's hooks all-reduce during backward, so an identical
  local copy of the model takes the same micro-batches and a plain torch.optim step; ZeRO's
  partitioned update and DeepSpeed's own per-step bookkeeping are outside it and count as
  exposed), or null with `note` saying why nothing was measured.
- skipped: why the step was not taken, no allocation tried (null where it was): the local
  replica where the planner's prediction of it (the `torch` cell at the micro-batch,
  memory.predicted.replica_bytes) beside what the run holds is over the device's limit
  (trainscale.plan.preflight.memory.replica_skipped); `method` is then null.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

#: No-sync steps per multi-worker run, at most and at least (after the timed epochs, never in
#: their figures): the median is taken over as many steps as the steady epochs' medians were,
#: so a short run (a steps_per_epoch of 3) is not lengthened several-fold by its own check.
STEPS, MIN_STEPS = 20, 3


def no_sync_steps(epochs: list[dict]) -> int:
    """The no-sync steps to time: the steady epochs' (2..E) timed steps, clipped to
    [MIN_STEPS, STEPS]."""
    timed = sum(e.get("steps") or 0 for e in epochs[1:])
    return max(MIN_STEPS, min(STEPS, timed))


def steady_step_seconds(epochs: list[dict]) -> float | None:
    """Rank 0's synchronised step time: mean of the steady epochs' per-step medians."""
    p50 = [e["step_seconds_p50"] for e in epochs[1:] if e.get("step_seconds_p50") is not None]
    return sum(p50) / len(p50) if p50 else None


def block(
    epochs: list[dict],
    compute: float | None,
    method: str | None,
    note: str | None = None,
    steps: int = STEPS,
    skipped: str | None = None,
) -> dict:
    """The `communication` block of metrics.json from the median time of `steps` no-sync
    steps."""
    step = steady_step_seconds(epochs)
    exposed = max(0.0, step - compute) if step is not None and compute is not None else None
    return {
        "compute_seconds_per_step": compute,
        "step_seconds_per_step": step,
        "exposed_seconds_per_step": exposed,
        "method": method,
        "steps": steps if compute is not None else 0,
        "note": note,
        "skipped": skipped,
    }


def replica_skipped(spec) -> str | None:
    """Why a DeepSpeed or Horovod run does not build its local replica (None: it does): the
    planner's prediction, recorded for this run
    (trainscale.plan.preflight.memory.replica_skipped)."""
    from trainscale.plan.preflight import memory

    return memory.replica_skipped(memory.recorded(spec))


def time_steps(step: Callable[[int], None], device: torch.device, steps: int = STEPS) -> float:
    """Median wall seconds of `steps` calls step(i), each ended by a device synchronisation."""
    seconds = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(i)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def batches_of(
    x: torch.Tensor,
    y: torch.Tensor,
    order: torch.Tensor,
    size: int,
    dtype: torch.dtype | None = None,
    image_size: tuple[int, int] | None = None,
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """batches(i): the i-th batch of `size` samples of this rank's last epoch order (wrapping),
    resized to `image_size` as training fed them, inputs cast to `dtype` where the model's
    parameters are in it (DeepSpeed bf16/fp16)."""
    from trainscale.data.imagedata import resize_batch

    count = max(1, len(order) // size)

    def batches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = order[(i % count) * size : (i % count + 1) * size]
        xb = resize_batch(x[idx], image_size)
        return (xb if dtype is None else xb.to(dtype)), y[idx]

    return batches


def held_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of `model` once, as the module holds them at rest.

    Asking the module for its state dict first runs FSDP2's pre-state-dict hooks, which put
    the sharded DTensor parameters back on every module: after a forward without backward
    (the evaluation) FSDP2 leaves the root's parameters unsharded, plain tensors, until its
    next backward. Each tensor is taken once, by identity: a tied matrix, or a module reachable
    by two attributes, appears under several names but is one tensor. Non-persistent buffers,
    which the state dict leaves out, are taken from `buffers()`."""
    held = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    for b in model.buffers():
        held.setdefault(id(b), b)
    return list(held.values())


@contextmanager
def weights_kept(model: torch.nn.Module, opt: torch.optim.Optimizer):
    """Put back the parameters, buffers and optimizer state after the block: the no-sync
    steps must not change what the run trained (final weights are compared by tests). Each
    tensor is copied back into the very object it was saved from, found again at rest
    (`held_tensors`), so a DTensor is restored from a DTensor and a plain tensor from a
    plain one, whatever the no-sync steps left gathered."""
    saved = [(t, t.detach().clone()) for t in held_tensors(model)]
    state = {
        p: {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in s.items()}
        for p, s in opt.state.items()
    }
    try:
        yield
    finally:
        held_tensors(model)  # FSDP2: the sharded parameters registered again
        with torch.no_grad():
            for t, s in saved:
                t.copy_(s)
        opt.state.clear()
        opt.state.update(state)
        opt.zero_grad(set_to_none=True)


def measure_exposed_communication(
    kind: str,
    epochs: list[dict],
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    grad_accum: int = 1,
) -> dict:
    """The `communication` block of a multi-worker run (see the module docstring).

    kind: `ddp` (model is DDP), `fsdp` (model is FSDP2-sharded), or `replica` (model and opt
    are a local copy with no communication at all: DeepSpeed ZeRO, Horovod). batches(i) gives
    the i-th micro-batch (x, y); a step is `grad_accum` of them and one optimizer step."""
    from trainscale.runners.torch.torch_parts import loss_of

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        for m in range(grad_accum):
            x, y = batches(i * grad_accum + m)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_of(model(x).float(), y) / grad_accum
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    n = no_sync_steps(epochs)
    methods = {"ddp": "ddp-no_sync", "fsdp": "fsdp-no-gradient-sync", "replica": "local-replica"}
    with weights_kept(model, opt):
        if kind == "ddp":
            with model.no_sync():
                compute = time_steps(step, device, n)
        elif kind == "fsdp":
            model.set_requires_gradient_sync(False)
            try:
                compute = time_steps(step, device, n)
            finally:
                model.set_requires_gradient_sync(True)
        elif kind == "replica":
            compute = time_steps(step, device, n)
        else:
            raise ValueError(f"measure_exposed_communication: unknown kind {kind!r}")
    return block(epochs, compute, methods[kind], steps=n)

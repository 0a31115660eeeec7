"""The pieces of a memory trace (trace.py): a run's model and batch as fake tensors, one
training step in the loop's order, the trackers' peaks by phase, and a model of many identical
blocks traced at three and four of them and scaled to all of them.

Phases: the first step (no optimizer state yet), the second step's forward and backward (the
first step's gradients dropped before its forward, as the loop drops them), and the second
step's optimizer step. Each phase's peak is kept apart, so that a model traced at a few blocks
can be scaled per phase: what a phase holds grows by the same bytes with every block added (its
parameters, gradients, optimizer state and saved activations), while what it holds once (the
embedding, the head, the loss, one block's temporaries) does not. The peak of the scaled phases
is the prediction, whichever phase it falls in at the real depth.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from trainscale.data import imagesets
from trainscale.models import torch_models as models
from trainscale.plan.runspec import RunSpec
from trainscale.runners.torch import checkpointing, torch_parts

#: the parts a prediction is given in, and the tracker categories each one sums
PARTS = {
    "parameters": ("Parameter", "Buffer", "Sharded Param", "Unsharded Param"),
    "gradients": ("Gradient", "Sharded Grad", "Unsharded Grad"),
    "optimizer": ("Optstate", "OptState"),
    "activations": ("Activation", "Inputs", "Other"),
    "temporaries": ("Temp",),
    "communication": ("All Gather", "Reduce Scatter"),
}
#: FSDP's shards (what CPUOffloadPolicy keeps on the host), apart from the gathered units
SHARDED = {"sharded_parameters": "Sharded Param", "sharded_gradients": "Sharded Grad"}
#: identical blocks from which a model is traced at TRACED_AT of them and scaled (fewer: whole)
MIN_REPEATS = 6
#: the depths a model of many blocks is traced at: 3 and 4, not 2 and 3, since at 2 blocks the
#: peak of FSDP's backward (its gradients dropped before the forward, as the loop drops them)
#: falls where no deeper model's does, and the growth from 2 to 3 is not the growth per block
TRACED_AT = (3, 4)

#: FakeTensorMode for predictions; real tensors (allocated, on CPU) to check them against
_REAL = [False]


@contextlib.contextmanager
def real_tensors():
    """Trace with real tensors instead of fake ones: the same step, allocated for real, so
    the trackers' figures for it can be compared with the fake trace's (tests, benchmarks)."""
    _REAL.append(True)
    try:
        yield
    finally:
        _REAL.pop()


@contextlib.contextmanager
def own_propagation():
    """DTensor's sharding propagation runs each op once more on fake tensors of the global
    shape, in the fake mode it finds active: in a trace, the trace's own, whose tracker then
    counts them (the head's whole-vocabulary logits and their gradient beside a rank's share)
    although no rank ever holds them. Finding none, it makes a fake mode of its own, whose ops
    the trackers leave out, as in a real run."""
    from torch.distributed.tensor import _sharding_prop

    found = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args: None
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = found


def faking() -> bool:
    """Whether traces are made of fake tensors (not inside `real_tensors`)."""
    return not _REAL[-1]


def tensors() -> contextlib.AbstractContextManager:
    """Fake tensors (real ones inside `real_tensors`). Meta tensors are let in as they are:
    a model materialised from the meta device, or a buffer a builder makes in its own way
    (torchvision's BatchNorm counts) hold no memory either."""
    return contextlib.nullcontext() if _REAL[-1] else FakeTensorMode(allow_non_fake_inputs=True)


def signature(block: nn.Module) -> tuple:
    """What makes two blocks the same to a trace: their class and their tensors' shapes."""
    held = [*block.named_parameters(), *block.named_buffers()]
    return type(block), tuple((n, tuple(t.shape), t.dtype) for n, t in held)


def repeats(net: nn.Module, own) -> tuple[nn.Module, int, int] | None:
    """(the container, the index of the first, how many) of the longest run of identical
    blocks in `net` (a GPT's blocks, an `hf:` model's decoder layers), or None where the model
    has no container of blocks to shorten."""
    held = net
    if own is not None:
        held = getattr(net, own.blocks, None) if own.blocks else None
    if not isinstance(held, nn.Sequential | nn.ModuleList) or len(held) < 2:
        return None
    marks = [signature(b) for b in held]
    best = (0, 1)
    start = 0
    for i in range(1, len(marks) + 1):
        if i == len(marks) or marks[i] != marks[start]:
            if i - start > best[1]:
                best = (start, i - start)
            start = i
    return held, best[0], best[1]


def meta_model(spec: RunSpec, keep: int | None = None) -> nn.Module:
    """The run's model from its builder on the meta device, its longest run of identical
    blocks cut to `keep` of them (None: whole), checkpointed as the runner checkpoints it."""
    info = imagesets.spec_info(spec.to_dict())
    with torch.device("meta"):
        net = models.build(spec.model, info.shape, info.num_classes, spec.own_model)
    if keep is not None:
        held, first, count = repeats(net, spec.own_model)
        del held[first + keep : first + count]
    checkpointing.apply(net, spec.own_model, spec.activation_checkpointing)
    return net


def fake_model(spec: RunSpec, device: torch.device, keep: int | None = None) -> nn.Module:
    """`meta_model`, its parameters and buffers fake tensors on `device` (ties kept: a tensor
    held by two modules stays one), laid out as the runner lays it."""
    from trainscale.runners.torch.torch_speed import memory_format

    net = meta_model(spec, keep)
    layout = memory_format(spec)
    made: dict[int, torch.Tensor] = {}
    for module in net.modules():
        for kind in ("_parameters", "_buffers"):
            held = getattr(module, kind)
            for name, t in list(held.items()):
                if t is None:
                    continue
                if id(t) not in made:
                    fmt = layout if t.dim() == 4 else torch.contiguous_format
                    fake = torch.empty_like(t, device=device, memory_format=fmt)
                    param = kind == "_parameters"
                    made[id(t)] = nn.Parameter(fake, t.requires_grad) if param else fake
                held[name] = made[id(t)]
    return net


def fake_batch(spec: RunSpec, batch: int, device: torch.device):
    """A batch of `batch` inputs and targets of the run's data set, as the loop feeds them."""
    info = imagesets.spec_info(spec.to_dict())
    if spec.seq_len:
        x = torch.zeros(batch, *info.shape, dtype=torch.long, device=device)
        return x, torch.zeros(batch, *info.shape, dtype=torch.long, device=device)
    from trainscale.runners.torch.torch_speed import laid_out

    x = laid_out(torch.zeros(batch, *info.shape, device=device), spec)
    return x, torch.zeros(batch, dtype=torch.long, device=device)


def trace_optimizer(spec: RunSpec, params, target: str) -> torch.optim.Optimizer:
    """The run's optimizer as it steps on `target`'s device, wherever this trace runs: foreach
    where the run's is foreach (its intermediates span every tensor at once), tensor by
    tensor where it is fused or a for-loop (torch's fused kernel keeps no intermediates; one
    tensor's are counted). The state it keeps is the same in every form."""
    how = torch_parts.optimizer_implementation(spec, "cuda" if target == "cuda" else "cpu")
    params = list(params)
    opt = torch_parts.make_optimizer(dataclasses.replace(spec, fused=False), params)
    groups = torch_parts.one_kind_per_group(params) if how == "foreach" else params
    if groups is not params:  # DTensor's foreach refuses plain tensors among its own (TP)
        opt.param_groups = []
        for group in groups:
            opt.add_param_group(group)
    for group in opt.param_groups:
        group["foreach"] = how == "foreach"
    return opt


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loop's cross-entropy (torch_parts.loss_of); a (1, 1) stand-in of a pipeline stage
    is its own loss."""
    if out.shape == (1, 1):
        return out.sum()
    return torch_parts.loss_of(out, y)


def forward_backward(model, opt, batches: list, device: torch.device, dtype) -> None:
    """The forward and backward of one step over `batches` (micro-batches accumulate), in the
    loop's order (Plugin.step, and the pipeline's): the previous step's gradients dropped
    first, then the forward and the loss under autocast, the logits cast to fp32 and held by
    nothing but autograd, and the backward. (A logits tensor held through the backward would
    add B·T·V bytes the run never holds; gradients held through the forward, the gradients'
    bytes: a forward that peaks, as a tensor-parallel step's loss does, would count them.)"""
    opt.zero_grad(set_to_none=True)
    for x, y in batches:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_of(model(x).float(), y)
        loss.backward()
        del loss


def tracked(tracker, model, opt, batches: list, device: torch.device, dtype) -> list[dict]:
    """The tracker's peak in each phase of two steps (the module docstring), by part. Entering
    the tracker starts its peak again from what is held."""
    phases = []
    for part in ("first step", "forward and backward", "optimizer step"):
        tracker.reset_mod_stats()  # its per-module figures hold one forward each
        with tracker:
            if part != "optimizer step":
                forward_backward(model, opt, batches, device, dtype)
            if part != "forward and backward":
                opt.step()
        phases.append(snapshot(tracker, device))
    return phases


def snapshot(tracker, device: torch.device) -> dict[str, int]:
    """The tracker's peak on `device` in PARTS, its FSDP shards (SHARDED) and its total."""
    peak = tracker.get_tracker_snapshot("peak")
    snap = peak.get(device) or next(iter(peak.values()), {})
    out = dict.fromkeys([*PARTS, *SHARDED], 0)
    for key, n in snap.items():
        name = getattr(key, "value", key)
        for part, names in [*PARTS.items(), *((k, (v,)) for k, v in SHARDED.items())]:
            if name in names:
                out[part] += int(n)
    out["total"] = int(snap.get("Total", sum(out[p] for p in PARTS)))
    return out


Trace = Callable[[RunSpec, torch.device, int | None], list[dict]]


def scaled_phases(trace: Trace, spec: RunSpec, device: torch.device, scale: bool) -> list[dict]:
    """`trace`'s phases for the whole model: traced whole, or, for a model of at least
    MIN_REPEATS identical blocks (and `scale`), traced at TRACED_AT of them and each phase's
    every figure carried on by its growth per block to the model's count."""
    found = repeats(meta_model(spec), spec.own_model) if scale else None
    count = found[2] if found else 0
    if count < MIN_REPEATS:
        return trace(spec, device, None)
    low, high = TRACED_AT
    shallow, deep = trace(spec, device, low), trace(spec, device, high)
    return [
        {k: b[k] + (count - high) * (b[k] - a[k]) for k in b}
        for a, b in zip(shallow, deep, strict=True)
    ]


def peak(phases: list[dict]) -> dict:
    """The phase with the largest total."""
    return dict(max(phases, key=lambda p: p["total"]))

"""Predicted memory per rank: one training step of a run traced without a GPU and without
allocating anything, through the runner's own wrapping code.

The model is built by the runners' builder on the meta device, given fake tensors of the trace
device (FakeTensorMode: shapes and dtypes, no storage), wrapped by the same functions its
runner calls (`pytorch.shard` for FSDP2, `tp_plans.parallelize` on a DeviceMesh, the
pipeline's `split`, DeepSpeed's `zero_estimate_bytes`), and stepped twice with the run's
optimizer (`make_optimizer`; the second step has its optimizer state) and precision (autocast,
FSDP's MixedPrecisionPolicy). A fake process group of the run's world size stands in for the
others. PyTorch's trackers (torch.distributed._tools: MemTracker, FSDPMemTracker) attribute
every byte; the peak of the rank with the largest need is the prediction:

- parameters (and buffers), gradients, optimizer state, activations (and the inputs),
  temporaries (the backward's gradients of activations, the optimizer's intermediates),
  communication: FSDP's all-gather and reduce-scatter buffers, DDP's gradient buckets (a
  second copy of the gradients), Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD);
- torch-dp: rank 0 also holds the gathered logits of the whole batch and their gradient;
- torch-pipeline: each stage traced with its blocks and as many micro-batches in flight as
  its schedule keeps (GPipe: all of them; 1F1B: stages − stage index), the largest stage's;
- deepspeed-zero0..3: DeepSpeed's own model-state estimate (the runner's
  `zero_estimate_bytes`, mixed-precision states as DeepSpeed counts them) plus the trace's
  activations and temporaries of one micro-batch;
- TensorFlow and Keras strategies: `model-states` only (fp32 parameters, gradients and the
  optimizer's slots, counted on the PyTorch twin), no trace.

Activation checkpointing (matrix activation_checkpointing) is traced as the runner applies
it: the activations a checkpointed block keeps are its input (full) or its matrix multiplies'
and attention's outputs (selective), and its recomputation is among the temporaries. Offload
(matrix offload) leaves out of a GPU's prediction what moves to the host: DeepSpeed's
estimate with its `cpu_offload` flags, and torch-fsdp's parameters, gradients and optimizer
state (`on_host`).

`method` says which: `traced` or `model-states`. A CUDA run is traced on fake CPU tensors
where this PyTorch has no CUDA (its autograd engine needs a CUDA device for a CUDA backward,
fake or not): CPU autocast's op lists and CPU attention kernels stand in for CUDA's, and the
caching allocator's 512-byte rounding is left out (`traced_on` says where it was traced).
`compile` is not traced (the eager step is), as the record says.

Run as a child of the planner: `python -m trainscale.runners.torch.memory_trace REQUEST ANSWER`
reads the run specs to predict from the file REQUEST and writes the answers to the file ANSWER;
stdout and stderr are only a log (a user's model may print anything).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from trainscale.data import imagesets
from trainscale.models import torch_models as models
from trainscale.plan import catalog
from trainscale.plan.runspec import RunSpec
from trainscale.runners.torch import checkpointing
from trainscale.runners.torch.torch_parts import DTYPES, make_optimizer

#: the parts a prediction is given in, and the tracker categories each one sums
PARTS = {
    "parameters": ("Parameter", "Buffer", "Sharded Param", "Unsharded Param"),
    "gradients": ("Gradient", "Sharded Grad", "Unsharded Grad"),
    "optimizer": ("Optstate", "OptState"),
    "activations": ("Activation", "Inputs", "Other"),
    "temporaries": ("Temp",),
    "communication": ("All Gather", "Reduce Scatter"),
}
#: Horovod's fusion buffer when HOROVOD_FUSION_THRESHOLD is not set (Horovod 0.28: 128 MiB)
HOROVOD_FUSION_BYTES = 128 * 2**20


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


def tensors() -> contextlib.AbstractContextManager:
    """Fake tensors; a meta tensor a builder makes in its own way (torchvision's BatchNorm
    buffers) is let in as it is: it holds no memory either."""
    return contextlib.nullcontext() if _REAL[-1] else FakeTensorMode(allow_non_fake_inputs=True)


def trace_device(target: str) -> torch.device:
    """Where a run for `target` ("cuda" or "cpu") is traced: fake CUDA tensors need a CUDA
    build with a device for their backward, else fake CPU tensors stand in."""
    return torch.device("cuda" if target == "cuda" and torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def fake_world(world: int):
    """A fake process group of `world` ranks in this one process (this process is rank 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def fake_model(spec: RunSpec, device: torch.device) -> nn.Module:
    """The run's model from its builder on the meta device, its parameters and buffers fake
    tensors on `device` (ties kept: a tensor held by two modules stays one), laid out as the
    runner lays it."""
    from trainscale.runners.torch.torch_speed import memory_format

    info = imagesets.spec_info(spec.to_dict())
    with torch.device("meta"):
        net = models.build(spec.model, info.shape, info.num_classes, spec.own_model)
    checkpointing.apply(net, spec.own_model, spec.activation_checkpointing)
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


def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loop's cross-entropy; a (1, 1) stand-in of a pipeline stage is its own loss."""
    if logits.shape == (1, 1):
        return logits.sum()
    return F.cross_entropy(logits.float().flatten(0, -2), y.flatten())


def step(model, opt, batches: list, device: torch.device, dtype) -> None:
    """One optimizer step over `batches` (micro-batches accumulate), as the loop takes it
    (logits split by vocabulary: their loss and backward under loss_parallel, as
    tensor_parallel's step)."""
    opt.zero_grad(set_to_none=True)
    for x, y in batches:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(x)
        with _loss_parallel() if hasattr(logits, "placements") else contextlib.nullcontext():
            loss_of(logits, y).backward()
        del logits
    opt.step()


def _loss_parallel():
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def tracked(tracker, model, opt, batches: list, device: torch.device, dtype) -> dict[str, int]:
    """The tracker's peak over two steps (the second has the optimizer's state), by part."""
    with tracker:
        for i in range(2):
            step(model, opt, batches, device, dtype)
            if i == 0:
                tracker.reset_mod_stats()
    return snapshot(tracker, device)


def snapshot(tracker, device: torch.device) -> dict[str, int]:
    """The tracker's peak on `device` in PARTS, and its total."""
    peak = tracker.get_tracker_snapshot("peak")
    snap = peak.get(device) or next(iter(peak.values()), {})
    out = dict.fromkeys(PARTS, 0)
    for key, n in snap.items():
        name = getattr(key, "value", key)
        for part, names in PARTS.items():
            if name in names:
                out[part] += int(n)
    out["total"] = int(snap.get("Total", sum(out.values())))
    return out


def plain(spec: RunSpec, device: torch.device, batch: int) -> tuple[dict, nn.Module]:
    """A step of the unwrapped model at `batch` samples per rank (torch, DDP, Horovod,
    Lightning): DDP and Horovod wrap it without changing what a step holds on the device."""
    dtype = DTYPES[spec.precision]
    with tensors():
        net = fake_model(spec, device)
        opt = make_optimizer(spec, net.parameters())
        batches = [fake_batch(spec, batch, device)]
        tracker = MemTracker()
        tracker.track_external(net, opt, *batches[0])
        return tracked(tracker, net, opt, batches, device, dtype), net


def grad_bytes(net: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)


def data_parallel(spec: RunSpec, device: torch.device) -> dict:
    """torch, torch-dp, torch-ddp, lightning-ddp, horovod-torch(-elastic)."""
    per_device = spec.per_worker_batch_size // spec.grad_accum  # one micro-batch's activations
    if spec.strategy == "torch-dp":
        per_device = max(1, spec.global_batch_size // spec.grad_accum // spec.workers)
    parts, net = plain(spec, device, per_device)
    extra = 0
    if spec.strategy in ("torch-ddp", "lightning-ddp"):
        extra = grad_bytes(net)  # DDP's buckets: a flat copy of every gradient
    elif spec.strategy.startswith("horovod-"):
        extra = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", HOROVOD_FUSION_BYTES))
    elif spec.strategy == "torch-dp" and spec.workers > 1:
        info = imagesets.spec_info(spec.to_dict())
        logits = (spec.global_batch_size - per_device) * info.num_classes * 4
        extra = 2 * logits * (spec.seq_len or 1)  # the gathered logits and their gradient
    parts["communication"] += extra
    parts["total"] += extra
    return parts


def fsdp(spec: RunSpec, device: torch.device) -> dict:
    """torch-fsdp: the runner's own sharding (`pytorch.shard`) on a fake world."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainscale.runners.torch.pytorch import shard

    with fake_world(spec.world_size):
        mesh = init_device_mesh(device.type, (spec.world_size,))
        with tensors():
            net = shard(fake_model(spec, device), DTYPES[spec.precision], False,
                        spec.own_model, mesh=mesh)  # fmt: skip
            opt = make_optimizer(spec, net.parameters())
            batches = [fake_batch(spec, spec.per_worker_batch_size // spec.grad_accum, device)]
            tracker = FSDPMemTracker(net, opt)
            tracker.track_inputs(batches[0])
            return tracked(tracker, net, opt, batches, device, None)


def on_host(parts: dict) -> dict:
    """torch-fsdp with offload params (CPUOffloadPolicy) on a GPU: the sharded parameters,
    their gradients and the optimizer state live on the host, so the device's peak is the
    rest: the gathered units (communication), activations and temporaries. (On CPU the host
    is the device: nothing leaves the prediction.)"""
    moved = sum(parts[k] or 0 for k in ("parameters", "gradients", "optimizer"))
    return {**parts, "parameters": 0, "gradients": 0, "optimizer": 0,
            "total": parts["total"] - moved}  # fmt: skip


def tensor_parallel(spec: RunSpec, device: torch.device) -> dict:
    """torch-tp and torch-fsdp-tp: the runner's plan (`tp_plans.parallelize`) on a fake
    dp × tp mesh, FSDP over dp as the runner shards."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainscale.runners.torch import tp_plans
    from trainscale.runners.torch.pytorch import shard

    dp = spec.world_size // spec.tp
    with fake_world(spec.world_size):
        mesh = init_device_mesh(device.type, (dp, spec.tp), mesh_dim_names=("dp", "tp"))
        with tensors():
            net = fake_model(spec, device)
            blocks = models.blocks(net, spec.own_model)
            tp_plans.parallelize(net, mesh["tp"], blocks, spec.own_model, sequence_parallel=True)
            dtype = DTYPES[spec.precision]
            if spec.strategy == "torch-fsdp-tp":
                shard(net, dtype, False, spec.own_model, mesh=mesh["dp"])
                dtype = None  # FSDP casts
            opt = make_optimizer(spec, net.parameters())
            batches = [fake_batch(spec, spec.global_batch_size // dp // spec.grad_accum, device)]
            if spec.strategy == "torch-fsdp-tp":
                tracker = FSDPMemTracker(net, opt)
                tracker.track_inputs(batches[0])
            else:
                tracker = MemTracker()
                tracker.track_external(net, opt, *batches[0])
            return tracked(tracker, net, opt, batches, device, dtype)


def pipeline(spec: RunSpec, device: torch.device) -> dict:
    """torch-pipeline: each stage of the runner's split, traced with one micro-batch, its
    activations counted as many times as its schedule keeps micro-batches in flight (GPipe:
    all of them; 1F1B: stages − stage index); the stage with the largest peak."""
    from trainscale.runners.torch.pipeline import split

    dtype, stages = DTYPES[spec.precision], spec.world_size
    worst: dict | None = None
    with tensors():
        net = fake_model(spec, device)
        blocks = list(models.blocks(net, spec.own_model))
        bounds = split([models.param_count(b) for b in blocks], stages)
        x, y = fake_batch(spec, spec.global_batch_size // spec.microbatches, device)
        for rank, (lo, hi) in enumerate(bounds):
            stage = Stage(nn.Sequential(*blocks[lo:hi]), last=rank == stages - 1)
            opt = make_optimizer(spec, stage.parameters())
            tracker = MemTracker()
            tracker.track_external(stage, opt, x)
            parts = tracked(tracker, stage, opt, [(x, y)], device, dtype)
            held = spec.microbatches if spec.pipeline_schedule == "gpipe" else stages - rank
            more = (max(1, min(held, spec.microbatches)) - 1) * parts["activations"]
            parts["activations"] += more
            parts["total"] += more
            parts["stage"] = rank
            if worst is None or parts["total"] > worst["total"]:
                worst = parts
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=bool(dtype)):
                x = stage.blocks(x)  # the next stage's input
    return worst


class Stage(nn.Module):
    """A pipeline stage as `step` drives it: its blocks, and for a stage before the last a
    stand-in loss (the sum) of what it sends on, so its backward runs as the schedule's does."""

    def __init__(self, blocks: nn.Sequential, last: bool) -> None:
        super().__init__()
        self.blocks, self.last = blocks, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(x)
        return out if self.last else out.float().sum().reshape(1, 1)


def deepspeed(spec: RunSpec, device: torch.device) -> dict:
    """deepspeed-zero0..3: DeepSpeed's model-state estimate, as the runner records it, plus
    the trace's activations and temporaries of one micro-batch."""
    from trainscale.runners.torch.deepspeed_zero import zero_estimate_bytes

    parts, net = plain(spec, device, spec.per_worker_batch_size // spec.grad_accum)
    states = zero_estimate_bytes(spec, net)
    out = {"parameters": None, "gradients": None, "optimizer": None, "model_states": states}
    out.update(activations=parts["activations"], temporaries=parts["temporaries"],
               communication=0)  # fmt: skip
    out["total"] = states + parts["activations"] + parts["temporaries"]
    return out


def model_states(spec: RunSpec) -> dict:
    """TensorFlow and Keras: fp32 variables, their gradients and the optimizer's slots (Adam's
    two moments, SGD's momentum where it is on), counted on the PyTorch twin, whose parameter
    count the Keras model matches."""
    info = imagesets.spec_info(spec.to_dict())
    with torch.device("meta"):
        n = models.param_count(models.build(spec.model, info.shape, info.num_classes,
                                            spec.own_model))  # fmt: skip
    slots = 2 if spec.optimizer in ("adam", "adamw") else int(spec.momentum > 0)
    parts = {"parameters": 4 * n, "gradients": 4 * n, "optimizer": 4 * n * slots,
             "activations": None, "temporaries": None, "communication": None}  # fmt: skip
    parts["total"] = 4 * n * (2 + slots)
    return parts


def predict(spec: RunSpec, target: str) -> dict:
    """The prediction of one run's peak per rank on `target` ("cuda" or "cpu")."""
    t0 = time.perf_counter()
    row = catalog.STRATEGIES[spec.strategy]
    if row.runtime == "tensorflow":
        parts, method, device = model_states(spec), "model-states", None
    else:
        device = trace_device(target)
        trace = {"torch-fsdp": fsdp, "torch-tp": tensor_parallel,
                 "torch-fsdp-tp": tensor_parallel, "torch-pipeline": pipeline}.get(
            spec.strategy, deepspeed if spec.strategy.startswith("deepspeed-") else data_parallel
        )  # fmt: skip
        # offload moves state off a GPU; on CPU the host is the device, and nothing moves.
        # The optimizer is traced tensor by tensor whatever optimizer.fused says: the state it
        # keeps is the same, and CPU's fused kernel on fake tensors allocates temporaries
        # CUDA's fused kernel does not (docs/memory.md)
        moving = dataclasses.replace(spec, fused=False)
        if target != "cuda":
            moving = dataclasses.replace(moving, offload="none")
        parts, method = trace(moving, device), "traced"
        if moving.strategy == "torch-fsdp" and moving.offload == "params":
            parts = on_host(parts)
    total = parts.pop("total")
    stage = parts.pop("stage", None)
    answer = {"total_bytes": total, "parts": parts, "method": method,
              "traced_on": device.type if device is not None else None,
              "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
    if stage is not None:
        answer["stage"] = stage
    return answer


def main(argv: list[str]) -> None:
    asked, answered = argv
    request = json.loads(Path(asked).read_text())
    target = request["target"]
    os.environ.setdefault("DS_ACCELERATOR", trace_device(target).type)
    torch.set_num_threads(1)
    answer = {}
    for key, spec_dict in request["runs"].items():
        spec = RunSpec.from_dict(spec_dict)
        try:
            answer[key] = predict(spec, target)
        except Exception as e:
            traceback.print_exc()
            answer[key] = {"error": f"{type(e).__name__}: {e}".strip().splitlines()[0]}
        said = answer[key].get("total_bytes")
        line = f"{said / 2**30:.3f} GiB" if said is not None else answer[key]["error"]
        print(f"trainscale: memory of {spec.path}: {line}", file=sys.stderr, flush=True)
    tmp = Path(answered).with_suffix(".partial")
    tmp.write_text(json.dumps(answer))
    tmp.replace(answered)  # whole or absent


if __name__ == "__main__":
    main(sys.argv[1:])

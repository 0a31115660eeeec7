"""Predicted memory per rank: one training step of a run traced without a GPU and without
allocating anything, through the runner's own wrapping code.

The model is built by the runners' builder on the meta device, given fake tensors of the trace
device (FakeTensorMode: shapes and dtypes, no storage), wrapped by the same functions its
runner calls (`pytorch.shard` for FSDP2, `tp_plans.parallelize` on a DeviceMesh, the
pipeline's `split`), and stepped twice in the loop's order with the run's optimizer as it
steps on the run's device (foreach or tensor by tensor, steps.trace_optimizer) and
precision (autocast, FSDP's MixedPrecisionPolicy). A fake process group of the run's world
size stands in for the others. PyTorch's trackers (torch.distributed._tools: MemTracker,
FSDPMemTracker) attribute every byte; the peak of the rank with the largest need is the
prediction (`total_bytes`, what torch.cuda.max_memory_allocated measures):

- parameters (and buffers), gradients, optimizer state, activations (and the inputs),
  temporaries (the backward's gradients of activations, the optimizer's intermediates),
  communication: FSDP's all-gather and reduce-scatter buffers, DDP's gradient buckets (a
  second copy of the gradients), Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD);
- torch-dp: rank 0 also holds the gathered logits of the whole batch and their gradient;
- torch-pipeline: each stage traced with its blocks and as many micro-batches in flight as
  its schedule keeps (GPipe: all of them; 1F1B: stages − stage index), the largest stage's;
- deepspeed-zero0..3: the model states and gradient buckets its ds_config sizes
  (plan.memory_parts.zero_states: the precision's bytes, the stage's partitioning, the
  offload flags) plus the trace's activations and temporaries of one micro-batch, the
  model cast to bf16 or fp16 and run without autocast, as its engine runs it;
- TensorFlow and Keras strategies: `model-states` only (fp32 parameters, gradients and the
  optimizer's slots, counted on the PyTorch twin), no trace.

On CUDA a process holds more than its tensors: `runtime` (the CUDA context and the libraries'
workspaces) and `nccl` (NCCL's buffers per communicator) are parts beside them
(plan.memory_parts.gpu_parts), and `reserved_bytes` = total_bytes + runtime + nccl is what
the process needs on its device: what config `memory:` holds against its limit.

A model of many identical blocks is traced at 3 and 4 of them and scaled per phase
(steps.scaled_phases). Activation checkpointing (matrix activation_checkpointing) is
traced as the runner applies it: the activations a checkpointed block keeps are its input
(full) or its matrix multiplies' and attention's outputs (selective), and its recomputation
is among the temporaries. Offload (matrix offload) leaves out of a GPU's prediction what moves
to the host: DeepSpeed's offloaded states, and torch-fsdp's sharded parameters, their
gradients and the optimizer state (`on_host`; the gathered units stay).

`method` says which: `traced` or `model-states`. A CUDA run is traced on fake CPU tensors
where this PyTorch has no CUDA (its autograd engine needs a CUDA device for a CUDA backward,
fake or not): CPU autocast's op lists and CPU attention kernels stand in for CUDA's, and the
caching allocator's 512-byte rounding is left out (`traced_on` says where it was traced).
`compile` is not traced (the eager step is), as the record says.

Run as a child of the planner: `python -m trainscale.runners.torch.memory.trace REQUEST ANSWER`
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
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from trainscale.data import imagesets
from trainscale.models import torch_models as models
from trainscale.models.init import to_empty
from trainscale.plan import catalog
from trainscale.plan.preflight import memory_parts
from trainscale.plan.runspec import RunSpec
from trainscale.runners.torch.memory.steps import (
    PARTS,
    SHARDED,
    fake_batch,
    fake_model,
    faking,
    meta_model,
    own_propagation,
    peak,
    scaled_phases,
    tensors,
    trace_optimizer,
    tracked,
)
from trainscale.runners.torch.torch_parts import DTYPES

#: Horovod's fusion buffer when HOROVOD_FUSION_THRESHOLD is not set (Horovod 0.28: 128 MiB)
HOROVOD_FUSION_BYTES = 128 * 2**20
#: what a plain step's trace depends on: cells that differ in nothing else share it (in one
#: child), as DeepSpeed's cells of every stage and world at one micro-batch do, and the `torch`
#: cell at that micro-batch that predicts their replica
PLAIN_FIELDS = ("model", "own_model", "dataset", "seq_len", "image_size", "image_source",
                "token_source", "samples", "precision", "optimizer", "momentum", "weight_decay",
                "fused", "activation_checkpointing", "memory_format")  # fmt: skip
_PLAIN: dict[str, list[dict]] = {}


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


def plain(spec: RunSpec, device: torch.device, keep: int | None, batch: int,
          target: str, cast: bool = False) -> list[dict]:  # fmt: skip
    """The phases of a step of the unwrapped model at `batch` samples per rank (torch, DDP,
    Horovod, Lightning, DeepSpeed's micro-batch): DDP and Horovod wrap it without changing
    what a step holds on the device. `cast`: the model in the precision's dtype and no
    autocast, as DeepSpeed's engine runs it where bf16 or fp16 is enabled: its activations
    are the dtype's throughout, where autocast keeps fp32 norms and softmax (traced under
    autocast, ZeRO-1/2 of gpt2-124m were over-predicted by 16 % on an H200; cast, by 9 %)."""
    dtype = DTYPES[spec.precision]
    with tensors():
        net = fake_model(spec, device, keep)
        x, y = fake_batch(spec, batch, device)
        if cast and dtype is not None:  # in place: `to` cannot swap a tied fake weight
            for t in (*net.parameters(), *net.buffers()):
                if t.is_floating_point():
                    t.data = t.data.to(dtype)
            x = x.to(dtype) if x.is_floating_point() else x  # images, as its runner casts them
            dtype = None
        opt = trace_optimizer(spec, net.parameters(), target)
        batches = [(x, y)]
        tracker = MemTracker()
        tracker.track_external(net, opt, *batches[0])
        return tracked(tracker, net, opt, batches, device, dtype)


def per_device_batch(spec: RunSpec) -> int:
    """One micro-batch's samples on a device (grad_accum of them make a step)."""
    if spec.strategy == "torch-dp":
        return max(1, spec.global_batch_size // spec.grad_accum // spec.workers)
    return spec.per_worker_batch_size // spec.grad_accum


def data_parallel_extra(spec: RunSpec, param_bytes: int) -> int:
    """What DDP, Horovod and DataParallel add to the plain step: DDP's buckets (a flat copy of
    every gradient), Horovod's fusion buffer, DataParallel's gathered logits and their
    gradient on its first device."""
    if spec.strategy in ("torch-ddp", "lightning-ddp"):
        return param_bytes
    if spec.strategy.startswith("horovod-"):
        return int(os.environ.get("HOROVOD_FUSION_THRESHOLD", HOROVOD_FUSION_BYTES))
    if spec.strategy == "torch-dp" and spec.workers > 1:
        info = imagesets.spec_info(spec.to_dict())
        micro = spec.global_batch_size // spec.grad_accum
        logits = (micro - per_device_batch(spec)) * info.num_classes * 4
        return 2 * logits * (spec.seq_len or 1)
    return 0


def fsdp(spec: RunSpec, device: torch.device, keep: int | None, target: str) -> list[dict]:
    """torch-fsdp: the runner's own sharding (`pytorch.shard`) on a fake world."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainscale.runners.torch.pytorch import shard

    with fake_world(spec.world_size):
        mesh = init_device_mesh(device.type, (spec.world_size,))
        with tensors():
            net = shard(fake_model(spec, device, keep), DTYPES[spec.precision], False,
                        spec.own_model, mesh=mesh)  # fmt: skip
            opt = trace_optimizer(spec, net.parameters(), target)
            batches = [fake_batch(spec, spec.per_worker_batch_size // spec.grad_accum, device)]
            tracker = FSDPMemTracker(net, opt)
            tracker.track_inputs(batches[0])
            return tracked(tracker, net, opt, batches, device, None)


def on_host(phase: dict) -> dict:
    """A phase of torch-fsdp with offload params (CPUOffloadPolicy) on a GPU: the sharded
    parameters, their gradients and the optimizer state live on the host; the gathered units
    (the parameters each unit runs with), activations and temporaries stay on the device.
    (On CPU the host is the device: nothing leaves the prediction.)"""
    params, grads = phase["sharded_parameters"], phase["sharded_gradients"]
    return {**phase, "parameters": phase["parameters"] - params, "optimizer": 0,
            "gradients": phase["gradients"] - grads,
            "total": phase["total"] - params - grads - phase["optimizer"]}  # fmt: skip


def tensor_parallel(spec: RunSpec, device: torch.device, keep: int | None,
                    target: str) -> list[dict]:  # fmt: skip
    """torch-tp and torch-fsdp-tp: the runner's plan (`tp_plans.parallelize`) on a fake
    dp × tp mesh, FSDP over dp as the runner shards."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainscale.runners.torch import tp_plans
    from trainscale.runners.torch.pytorch import shard

    dp = spec.world_size // spec.tp
    dtype = DTYPES[spec.precision]
    with fake_world(spec.world_size):
        mesh = init_device_mesh(device.type, (dp, spec.tp), mesh_dim_names=("dp", "tp"))
        # planned and sharded on the meta device, then materialised, as the runner does: the
        # meshes' (real) tensors of ranks are read outside the fake mode
        net = meta_model(spec, keep)
        blocks = models.blocks(net, spec.own_model)
        tp_plans.parallelize(net, mesh["tp"], blocks, spec.own_model, sequence_parallel=True)
        if spec.strategy == "torch-fsdp-tp":
            shard(net, dtype, False, spec.own_model, mesh=mesh["dp"])
            dtype = None  # FSDP casts
        with tensors(), own_propagation():
            to_empty(net, device)
            opt = trace_optimizer(spec, net.parameters(), target)
            batches = [fake_batch(spec, spec.global_batch_size // dp // spec.grad_accum, device)]
            if spec.strategy == "torch-fsdp-tp":
                tracker = FSDPMemTracker(net, opt)
                tracker.track_inputs(batches[0])
            else:
                tracker = MemTracker()
                tracker.track_external(net, opt, *batches[0])
            return tracked(tracker, net, opt, batches, device, dtype)


def pipeline(spec: RunSpec, device: torch.device, target: str) -> dict:
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
            opt = trace_optimizer(spec, stage.parameters(), target)
            tracker = MemTracker()
            tracker.track_external(stage, opt, x)
            parts = peak(tracked(tracker, stage, opt, [(x, y)], device, dtype))
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
    """A pipeline stage as the trace steps it: its blocks, and for a stage before the last a
    stand-in loss (the sum) of what it sends on, so its backward runs as the schedule's does."""

    def __init__(self, blocks: nn.Sequential, last: bool) -> None:
        super().__init__()
        self.blocks, self.last = blocks, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(x)
        return out if self.last else out.float().sum().reshape(1, 1)


def deepspeed(spec: RunSpec, phases: list[dict], net: nn.Module) -> dict:
    """deepspeed-zero0..3: the model states and buckets of the run's ds_config, plus the
    activations and temporaries of the plain micro-batch's phase that holds most of them."""
    from trainscale.plan.deepspeed_config import ds_config, load_fragment

    params = models.param_count(net)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in net.modules())
    config = ds_config(spec, load_fragment(spec.deepspeed_config))
    states = memory_parts.zero_states(spec, config, params, largest)
    step = max(phases, key=lambda p: p["activations"] + p["temporaries"])
    out = {"parameters": None, "gradients": None, "optimizer": None,
           "model_states": states["model_states"], "activations": step["activations"],
           "temporaries": step["temporaries"], "communication": states["buckets"]}  # fmt: skip
    out["total"] = sum(out[k] for k in ("model_states", "activations", "temporaries",
                                        "communication"))  # fmt: skip
    out["host_offload"] = states["host"]
    return out


def model_states(spec: RunSpec) -> dict:
    """TensorFlow and Keras: fp32 variables, their gradients and the optimizer's slots (Adam's
    two moments, SGD's momentum where it is on), counted on the PyTorch twin, whose parameter
    count the Keras model matches."""
    n = models.param_count(meta_model(spec))
    slots = memory_parts.optimizer_state_bytes(spec) // 4
    parts = {"parameters": 4 * n, "gradients": 4 * n, "optimizer": 4 * n * slots,
             "activations": None, "temporaries": None, "communication": None}  # fmt: skip
    parts["total"] = 4 * n * (2 + slots)
    return parts


def traced(spec: RunSpec, target: str, scale: bool) -> dict:
    """The peak parts of the step of a PyTorch-family run on `target` (its total among them)."""
    device = trace_device(target)
    if spec.strategy == "torch-pipeline":
        return pipeline(spec, device, target)
    if spec.strategy == "torch-fsdp":
        phases = scaled_phases(lambda s, d, k: fsdp(s, d, k, target), spec, device, scale)
        if target == "cuda" and spec.offload == "params":
            phases = [on_host(p) for p in phases]
        return peak(phases)
    if spec.strategy in ("torch-tp", "torch-fsdp-tp"):
        return peak(scaled_phases(lambda s, d, k: tensor_parallel(s, d, k, target), spec,
                                  device, scale))  # fmt: skip
    deep = spec.strategy.startswith("deepspeed-")
    batch = per_device_batch(spec)
    seen = json.dumps([{k: getattr(spec, k) for k in PLAIN_FIELDS}, batch, target, scale,
                       faking(), deep], sort_keys=True, default=str)  # fmt: skip
    if seen not in _PLAIN:  # shared: DeepSpeed's cells of any stage and world
        _PLAIN[seen] = scaled_phases(lambda s, d, k: plain(s, d, k, batch, target, deep),
                                     spec, device, scale)  # fmt: skip
    phases = [dict(p) for p in _PLAIN[seen]]
    net = meta_model(spec)
    if deep:
        return deepspeed(spec, phases, net)
    parts = peak(phases)
    param_bytes = sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
    extra = data_parallel_extra(spec, param_bytes)
    parts["communication"] += extra
    parts["total"] += extra
    return parts


def predict(spec: RunSpec, target: str, scale: bool = True) -> dict:
    """The prediction of one run's peak per rank on `target` ("cuda" or "cpu"). `scale`: a
    model of many identical blocks traced at a few of them and scaled (False: whole)."""
    t0 = time.perf_counter()
    row = catalog.STRATEGIES[spec.strategy]
    device = None
    if row.runtime == "tensorflow":
        parts, method = model_states(spec), "model-states"
    else:
        device = trace_device(target)
        # offload moves state off a GPU; on CPU the host is the device, and nothing moves
        moving = spec if target == "cuda" else dataclasses.replace(spec, offload="none")
        parts, method = traced(moving, target, scale), "traced"
    total = parts.pop("total")
    stage = parts.pop("stage", None)
    host_offload = parts.pop("host_offload", None)
    for key in SHARDED:
        parts.pop(key, None)
    parts = {k: parts.get(k) for k in (*PARTS, *(["model_states"] if "model_states" in parts
                                                  else []))}  # fmt: skip
    gpu = memory_parts.gpu_parts(spec, target)
    parts.update(gpu)
    answer = {"total_bytes": total, "reserved_bytes": total + gpu["runtime"] + gpu["nccl"],
              "parts": parts, "method": method,
              "traced_on": device.type if device is not None else None,
              "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
    if stage is not None:
        answer["stage"] = stage
    if host_offload is not None:
        answer["host_offload_bytes"] = host_offload
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

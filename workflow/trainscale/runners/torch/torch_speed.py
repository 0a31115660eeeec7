"""The speed options (trainscale.plan.speed_options) as the PyTorch-family runners apply them, and
what the record says of them, read from the tensors and from TorchDynamo rather than from the
config: the layout the model's convolution weights really have, and how many graphs
`torch.compile` really built.
"""

from __future__ import annotations

import sys

import torch

from trainscale.plan.matrix import RunSpec


def memory_format(spec: RunSpec) -> torch.memory_format:
    """The layout `spec.memory_format` names."""
    return torch.channels_last if spec.memory_format == "channels_last" else torch.contiguous_format


def laid_out(x: torch.Tensor, spec: RunSpec) -> torch.Tensor:
    """An image batch (N, C, H, W) in the run's layout; a no-op when it has it already, so a
    data set converted once stays unconverted per step (indexing keeps the layout)."""
    if spec.memory_format == "contiguous" or x.dim() != 4:
        return x
    return x.contiguous(memory_format=torch.channels_last)


def compiled(model: torch.nn.Module, spec: RunSpec) -> torch.nn.Module:
    """`torch.compile(model)` (default mode) when the run asks for it, else `model`. It shares
    `model`'s parameters; compilation happens at the first call, in the first epoch."""
    return torch.compile(model) if spec.compile else model


def weight_layout(model: torch.nn.Module) -> str | None:
    """How the model's 4-D (convolution) weights are stored: "channels_last" or "contiguous"
    ("mixed" if both), read from their strides (a sharded parameter's local shard). Weights
    stored alike either way (one input channel, 1×1 kernels, a ZeRO-3 partition) tell nothing;
    None when no weight tells."""
    seen = set()
    for p in model.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p  # FSDP2: a DTensor's local shard
        if t.dim() != 4:
            continue
        nhwc, nchw = t.is_contiguous(memory_format=torch.channels_last), t.is_contiguous()
        if nhwc != nchw:
            seen.add("channels_last" if nhwc else "contiguous")
    if len(seen) > 1:
        return "mixed"
    return seen.pop() if seen else None


def compiled_graphs() -> int:
    """Graphs TorchDynamo (torch.compile) built in this process so far; 0 when nothing was
    compiled (TorchDynamo is then not even imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["stats"]["unique_graphs"]) if utils else 0


def model_facts(model: torch.nn.Module) -> dict:
    """The record's `model` entries for the options: memory_format and compiled_graphs."""
    return {"memory_format": weight_layout(model), "compiled_graphs": compiled_graphs()}

"""What the `flops` block needs from PyTorch: the FLOPs of one training sample, counted on the
meta device, and the devices' peak (datasheet, or a GEMM timed on this host). The definitions
are trainscale.measure.flops'."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainscale.measure import flops, metrics
from trainscale.models import gpt
from trainscale.models import torch_models as models
from trainscale.plan import catalog
from trainscale.plan.runspec import RunSpec
from trainscale.runners.torch import checkpointing
from trainscale.runners.torch.torch_parts import DTYPES


def per_sample(
    model: str,
    shape: tuple[int, ...],
    classes: int,
    own=None,
    checkpointed: str = "none",
    tp: int = 1,
) -> float:
    """FLOPs of forward and backward of `model` on one sample of `shape` (a (C, H, W)
    image, or (context,) token ids whose classes are the vocabulary), on the meta device (under
    fake tensors). What the hardware runs, where asked: with `checkpointed` (activation
    checkpointing full or selective), the forward operations recomputed in the backward pass
    counted again; with `tp` (a tensor-parallel degree), what the plan leaves whole counted
    once per rank of the group (tp_plans.split_modules: the blocks it splits, the embedding and
    head split by vocabulary, each counted split whole)."""
    tokens = (own.input if own is not None else catalog.MODELS[model].input) == "tokens"
    with torch.device("meta"):
        net = models.build(model, shape, classes, own)
        checkpointing.apply(net, own, checkpointed)
        x = torch.zeros(1, *shape, dtype=torch.long) if tokens else torch.zeros(1, *shape)
    counter = FlopCounterMode(display=False)
    with counter, models.fake_forward():
        # backward from the logits' sum: the loss adds no matrix multiply, and the backward
        # pass of every layer costs the same whatever gradient reaches the logits
        net(x).float().sum().backward()
    total = counter.get_total_flops()
    if tp > 1:
        total += (tp - 1) * (total - _split_flops(counter, net, own))
    return float(total)


def _split_flops(counter: FlopCounterMode, net: torch.nn.Module, own) -> int:
    """The counted FLOPs inside the modules tensor parallelism splits (by the names the
    counter's module tracker gave them; a module inside another counted once)."""
    from trainscale.runners.torch.tp_plans import split_modules

    split = split_modules(net, models.blocks(net, own), own)
    inner = {id(m) for outer in split for m in outer.modules() if m is not outer}
    names = counter.mod_tracker._known_modules  # module -> the name its counts are under
    by_name = counter.get_flop_counts()
    return sum(sum(by_name.get(names.get(m), {}).values()) for m in split if id(m) not in inner)


def gemm(precision: str, device: torch.device) -> float:
    """The best FLOP/s of a matrix multiply at `precision` on `device` (flops.GEMM_SIDE)."""
    side, dtype = flops.GEMM_SIDE, DTYPES[precision] or torch.float32
    a = torch.randn(side, side, device=device).to(dtype)
    b = torch.randn(side, side, device=device).to(dtype)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    return flops.gemm_flops_per_second(lambda: a @ b, side, sync)


def cpu_gemm(precision: str, threads: int) -> float:
    """`gemm` on the CPU at `threads` torch threads (the process's count is put back)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return gemm(precision, torch.device("cpu"))
    finally:
        torch.set_num_threads(before)


def device_peak(spec: RunSpec, device: torch.device, out: str | Path) -> tuple[float, str, str]:
    """(peak FLOP/s of one device at the run's precision, its source, the device's name); on
    CPU a device is a worker's threads_per_worker threads."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    name = gpu or metrics.cpu_name()
    if gpu:
        key, measure = f"cuda:{name}:{spec.precision}", lambda: gemm(spec.precision, device)
    else:
        threads = spec.threads_per_worker
        key, measure = (
            flops.cpu_key(name, spec.precision, threads),
            lambda: cpu_gemm(spec.precision, threads),
        )
    tf32 = torch.backends.cuda.matmul.allow_tf32
    peak, source = flops.peak(gpu, spec.precision, key, flops.peaks_dir(spec.path, out),
                              metrics.hostname(), measure, tf32=tf32)  # fmt: skip
    return peak, source, name


def count(spec: RunSpec, shape: tuple[int, ...], classes: int) -> dict:
    """`per_sample` and `method` of the run's model, `hardware_per_sample` with its activation
    checkpointing and what its tensor-parallel plan leaves whole, and for a GPT PaLM's
    analytic count (`analytic_per_sample`); the Keras runs take their twin's from here too."""
    own, recomputed = spec.own_model, spec.activation_checkpointing
    tp = spec.tp if spec.strategy in catalog.TENSOR_PARALLEL else 1
    block = {"per_sample": per_sample(spec.model, shape, classes, own), "method": "flop_counter"}
    if recomputed != "none" or tp > 1:  # what the hardware ran; hfu (measure.flops.block)
        block["hardware_per_sample"] = per_sample(spec.model, shape, classes, own, recomputed,
                                                  tp)  # fmt: skip
    if own is None and catalog.MODELS[spec.model].gpt:
        block["analytic_per_sample"] = (
            gpt.analytic_flops_per_token(spec.model, shape[0], classes) * shape[0]
        )
    return block


def counted(spec: RunSpec, shape: tuple[int, ...], classes: int, device: torch.device,
            out: str | Path, devices: int) -> dict:  # fmt: skip
    """The runner's part of the `flops` block (trainscale.measure.flops.block adds the rest)."""
    block = count(spec, shape, classes)
    peak, source, name = device_peak(spec, device, out)
    block.update(peak_per_second=peak * devices, peak_source=source, peak_device=name)
    return block

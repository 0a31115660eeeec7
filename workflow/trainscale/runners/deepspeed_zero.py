"""DeepSpeed ZeRO stages 0-3 (`deepspeed-zero0` … `deepspeed-zero3`), launched by torchrun.

The same data, model, optimizer (a torch.optim client optimizer, so every strategy runs the
identical update rule) and loop shape as runners/pytorch.py; DeepSpeed owns the backward,
the gradient reduction/partitioning and the step. gloo on CPU (DeepSpeed's CPU accelerator),
NCCL on GPU. One optimizer step = `grad_accum` micro-batches of the per-worker batch.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch.distributed.elastic.multiprocessing.errors import record
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
from trainscale.runners.exposed import batches_of, measure_exposed_communication
from trainscale.runners.pytorch import (
    _Indexable,
    barrier,
    evaluate,
    leave,
    make_optimizer,
    phase_peaks,
    to_tensors,
)

#: ds_config keys the study owns: a user fragment may not override them.
STUDY_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "optimizer",
    "scheduler",
)
TIMERS = {"forward": "fwd", "backward": "bwd", "step": "step"}


def stage(spec: RunSpec) -> int:
    return int(spec.strategy.removeprefix("deepspeed-zero"))


def merge(base: dict, over: dict) -> dict:
    """Recursive dict merge: `over` wins, nested mappings are merged key by key."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_fragment(path: str | None) -> dict:
    """The user's ds_config fragment (JSON or YAML); refuses keys the study owns."""
    if not path:
        return {}
    text = Path(path).read_text()
    frag = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    if not isinstance(frag, dict):
        raise ValueError(f"deepspeed_config {path}: expected a mapping, got {type(frag).__name__}")
    clash = [k for k in STUDY_KEYS if k in frag]
    if clash:
        raise ValueError(
            f"deepspeed_config {path} sets {', '.join(clash)}: batch sizes and the optimizer "
            "come from the study (matrix.batch_size, grad_accum, optimizer) so every strategy "
            "trains alike; remove them from the fragment"
        )
    return frag


def ds_config(spec: RunSpec, fragment: dict | None = None) -> dict:
    """The ds_config for a run: batch sizes, ZeRO stage and precision from the spec."""
    cfg = {
        "train_batch_size": spec.global_batch_size,
        "train_micro_batch_size_per_gpu": spec.per_worker_batch_size // spec.grad_accum,
        "gradient_accumulation_steps": spec.grad_accum,
        "zero_optimization": {"stage": stage(spec)},
        # torch.optim.SGD is not on ZeRO's tested list; the update rule is the study's
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "bf16": {"enabled": spec.precision == "bf16"},
        "fp16": {
            "enabled": spec.precision == "fp16",
            "loss_scale": 0,  # dynamic loss scaling
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        # DeepSpeed times forward/backward/step itself (host timers on CPU, events on GPU) and
        # logs one line per step; the runner averages them over the steady epochs.
        "wall_clock_breakdown": True,
        "steps_per_print": 2**31 - 1,
    }
    return merge(cfg, fragment or {})


def zero_estimate_bytes(spec: RunSpec, net: torch.nn.Module) -> int:
    """DeepSpeed's model-state memory estimate per device, no offload (stage 0: world 1)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    total = models.param_count(net)
    per_node = spec.workers if stage(spec) else 1
    nodes = spec.nodes if stage(spec) else 1
    if stage(spec) == 3:
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in net.modules())
        _, dev, _ = estimate_zero3_model_states_mem_needs(
            total, largest, per_node, nodes, cpu_offload=False, zero_init=False
        )
        return dev
    _, dev = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=False)
    return dev


@record
def main(spec: RunSpec, out: str) -> None:
    rec = metrics.Recorder(spec.to_dict())
    rk = detect_rank()
    torch.set_num_threads(spec.threads_per_worker)
    cuda = torch.cuda.is_available()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")  # before the import
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    device = torch.device(f"cuda:{rk.local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    t_init = time.perf_counter()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    init_seconds = time.perf_counter() - t_init
    acc = get_accelerator()
    if spec.precision == "fp16" and not acc.is_fp16_supported():
        raise RuntimeError(
            f"precision fp16 is not supported by DeepSpeed's {acc.device_name()} accelerator on "
            "this machine; use bf16 or fp32 for this strategy here"
        )
    if spec.precision == "bf16" and not acc.is_bf16_supported():
        raise RuntimeError(f"precision bf16 is not supported by DeepSpeed's {acc.device_name()}")

    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed, samples=spec.samples)
    train_x, train_y, test_x, test_y = to_tensors(arrays, device)
    n = len(train_y)
    train_samples = n * spec.scale
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.precision)

    torch.manual_seed(spec.seed)  # the same fresh initial weights on every rank
    net = models.build(spec.model, arrays.info.shape, arrays.info.num_classes)
    zero_estimate = zero_estimate_bytes(spec, net)
    params = models.param_count(net)
    fragment = load_fragment(spec.deepspeed_config)
    config = ds_config(spec, fragment)
    t_init = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(
        model=net, optimizer=make_optimizer(spec, net.parameters()), config=config
    )
    init_seconds += time.perf_counter() - t_init

    sampler = DistributedSampler(
        _Indexable(train_samples),
        num_replicas=rk.world_size,
        rank=rk.rank,
        shuffle=True,
        seed=spec.seed,
        drop_last=True,
    )
    b, ga = spec.per_worker_batch_size, spec.grad_accum
    micro = b // ga
    steps = steps_per_epoch(train_samples, rk.world_size, b, spec.steps_per_epoch)
    check_steps(steps, spec.path, train_samples, spec.global_batch_size)
    memory = phase_peaks(device)
    engine.train()
    rec.training_starts()
    test_acc = test_loss = None
    breakdown_sum = dict.fromkeys(TIMERS, 0.0)
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
            for m in range(ga):  # DeepSpeed steps the optimizer at the accumulation boundary
                idx = order[step * b + m * micro : step * b + (m + 1) * micro]
                x, y = train_x[idx], train_y[idx]
                loss = F.cross_entropy(engine(x if dtype is None else x.to(dtype)).float(), y)
                engine.backward(loss)
                engine.step()
                loss_sum += loss.detach()
            if epoch > 1:  # DeepSpeed's own breakdown of this step, over the steady epochs
                snap = engine.get_wall_clock_timers()
                for k, name in TIMERS.items():
                    breakdown_sum[k] += snap.get(name, 0.0)
            acc.synchronize()
            step_seconds.append(time.perf_counter() - t_step)
        barrier(True, device)
        seconds = time.perf_counter() - t_epoch
        dist.all_reduce(loss_sum)
        train_loss = (loss_sum / (steps * ga * rk.world_size)).item()
        evaluated = evaluates(spec, arrays.info.synthetic, epoch)
        if evaluated:
            memory.evaluation_starts()
            test_acc, test_loss = evaluate(
                engine, test_x, test_y, rk.rank, rk.world_size, True, b, input_dtype=dtype
            )
            memory.evaluation_ends()
        e = rec.epoch(
            seconds,
            samples=steps * spec.global_batch_size,
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
    steady_steps = steps * (spec.epochs - 1)
    breakdown = {k: v / steady_steps for k, v in breakdown_sum.items()}

    peaks = torch.tensor(memory.finish(), dtype=torch.float64, device=device)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    hosts: list = [None] * rk.world_size
    dist.all_gather_object(hosts, metrics.hostname())
    # After the timed epochs and the memory peaks; in none of their figures.
    if rk.world_size > 1:
        replica = models.build(spec.model, arrays.info.shape, arrays.info.num_classes).to(device)
        rec.communication = measure_exposed_communication(
            "replica", rec.epochs, replica.to(dtype) if dtype else replica,
            make_optimizer(spec, replica.parameters()),
            batches_of(train_x, train_y, order, micro, dtype), device, grad_accum=ga,
        )  # fmt: skip
    weights_path = os.environ.get("TRAINSCALE_SAVE_WEIGHTS")  # final weights, for tests
    weights = None
    if weights_path:
        if stage(spec) == 3:
            weights = engine._zero3_consolidated_16bit_state_dict()  # a collective
        else:
            weights = engine.module.state_dict()

    if rk.is_main:
        env = metrics.environment(
            rec.start_utc, {"torch": torch.__version__, "deepspeed": deepspeed.__version__}, hosts
        )
        env["cuda"] = torch.version.cuda if cuda else None
        result = rec.record(
            model={"params": params},
            data={"train_samples": train_samples, "test_samples": len(test_y)},
            test={"accuracy": test_acc, "loss": test_loss},
            memory={
                **memory_block(peaks.tolist(), cuda),
                "zero_estimate_bytes": zero_estimate,
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
            deepspeed={
                "config": config,
                "fragment": spec.deepspeed_config,
                "init_seconds": init_seconds,
                "breakdown_ms": breakdown,
            },
        )
        metrics.write(out, result)
        if weights_path:
            torch.save({k: v.float() for k, v in weights.items()}, weights_path)
        print(
            f"trainscale: ok, throughput {fmt_rate(result['throughput'])} samples/s; wrote {out}",
            flush=True,
        )
    # Without teardown, as every torchrun worker here ends: besides gloo's exit deadlock,
    # DeepSpeed's CPU backend sometimes aborts in its atexit teardown ("terminate called
    # without an active exception").
    leave()


def build_ops() -> None:
    """Compile the ops DeepSpeed JIT-builds on first use into TORCH_EXTENSIONS_DIR, once, so
    no run pays (or measures) the compile: the `deepspeed_ops` rule calls this."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    import deepspeed.ops  # noqa: F401  (fills __compatible_ops__)
    from deepspeed.accelerator import get_accelerator

    names = ["ShareMemCommBuilder"] if get_accelerator().device_name() == "cpu" else []
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None or not builder.is_compatible():
            print(f"{name}: not compatible with this machine, DeepSpeed will not use it")
            continue
        t0 = time.perf_counter()
        builder.load()
        print(f"{name} ({builder.absolute_name()}): ready in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    if sys.argv[1:] != ["--build-ops"]:
        raise SystemExit("usage: python -m trainscale.runners.deepspeed_zero --build-ops")
    build_ops()

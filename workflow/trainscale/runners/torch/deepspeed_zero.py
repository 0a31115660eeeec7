"""DeepSpeed ZeRO stages 0-3 (`deepspeed-zero0` … `deepspeed-zero3`), launched by torchrun.

A plug-in on the PyTorch loop (torch_loop.py): the same data, model, optimizer (a
torch.optim client optimizer, so every strategy runs the identical update rule) and timed
epochs as every PyTorch-family strategy; DeepSpeed owns the backward,
the gradient reduction/partitioning and the step. gloo on CPU (DeepSpeed's CPU accelerator),
NCCL on GPU. One optimizer step = `grad_accum` micro-batches of the per-worker batch.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainscale.launch import container
from trainscale.models import torch_models as models
from trainscale.plan.deepspeed_config import ds_config, load_fragment, stage
from trainscale.plan.matrix import RunSpec
from trainscale.runners.torch import checkpointing
from trainscale.runners.torch.exposed import block, measure_exposed_communication, replica_skipped
from trainscale.runners.torch.plugin import Plugin, Shard
from trainscale.runners.torch.torch_loop import run
from trainscale.runners.torch.torch_parts import loss_of, make_optimizer
from trainscale.runners.torch.torch_speed import compiled

if TYPE_CHECKING:
    from deepspeed.ops.op_builder.builder import OpBuilder

TIMERS = {"forward": "fwd", "backward": "bwd", "step": "step"}


def cpu_adam_builder() -> OpBuilder | None:
    """DeepSpeed's builder of its CPU Adam op, for this machine's accelerator, compiling
    without debug info (-g; -O3 and the rest of DeepSpeed's flags kept): on 2 cores shared
    with another job, two builds with -g took 136 and 201 CPU-s, two without it 103 and 111.
    The `deepspeed_cpu_adam` rule builds with it and every run loads with it (cpu_adam): torch's
    JIT keys a build by its flags, so a run loading with other flags would compile it again.
    None where the accelerator's DeepSpeed has no CPU Adam."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().get_op_builder("CPUAdamBuilder")
    if builder is None:
        return None

    class NoDebugInfo(builder):
        def cxx_args(self) -> list[str]:
            return [a for a in super().cxx_args() if a != "-g"]

    return NoDebugInfo()


def cpu_adam(spec: RunSpec, params) -> torch.optim.Optimizer:
    """DeepSpeed's CPU Adam, which steps an offloaded optimizer on the host: the study's Adam
    (L2 weight decay) or AdamW (decoupled) with its settings. Its op is loaded first by
    cpu_adam_builder, as the rule built it; DeepSpeedCPUAdam then finds it loaded (DeepSpeed
    keeps loaded ops by name) instead of loading its own build."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    if (builder := cpu_adam_builder()) is not None:  # else DeepSpeedCPUAdam says it has none
        builder.load()
    return DeepSpeedCPUAdam(params, lr=spec.lr, betas=spec.betas, eps=spec.eps,
                            weight_decay=spec.weight_decay,
                            adamw_mode=spec.optimizer == "adamw")  # fmt: skip


def zero_estimate_bytes(spec: RunSpec, net: torch.nn.Module) -> int:
    """DeepSpeed's model-state memory estimate per device (stage 0: world 1), with the run's
    offload: the optimizer's state on the host, and at ZeRO-3 with `params` the parameters
    too."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    total = models.param_count(net)
    per_node = spec.workers if stage(spec) else 1
    nodes = spec.nodes if stage(spec) else 1
    if stage(spec) == 3:
        largest = max(sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters(recurse=False))
                      for m in net.modules())  # fmt: skip
        _, dev, _ = estimate_zero3_model_states_mem_needs(
            total, largest, per_node, nodes, cpu_offload=spec.offload != "none",
            cpu_offload_params=spec.offload == "params", zero_init=False,
        )  # fmt: skip
        return dev
    _, dev = estimate_zero2_model_states_mem_needs(
        total, per_node, nodes, cpu_offload=spec.offload != "none"
    )
    return dev


#: A build lock older than this is a build that died (killed by a timeout or a cancelled job):
#: torch's cpp_extension waits on a lock file with no limit, so every later run would hang.
#: A real build of DeepSpeed's CPU ops takes a minute or two.
STALE_LOCK_SECONDS = 600


def clear_stale_build_locks(now: float | None = None) -> list[Path]:
    """Remove the op-build locks under TORCH_EXTENSIONS_DIR left by a build that died (older
    than STALE_LOCK_SECONDS), saying so on stderr; the locks removed."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        return []
    now = time.time() if now is None else now
    removed = []
    for lock in Path(root).glob("*/lock"):
        try:
            if now - lock.stat().st_mtime > STALE_LOCK_SECONDS:
                lock.unlink()
                removed.append(lock)
        except FileNotFoundError:
            continue
    for lock in removed:
        print(f"trainscale: removed {lock}, left by a build that died", file=sys.stderr)
    return removed


class ZeRO(Plugin):
    """DeepSpeed's engine around the model and a torch.optim optimizer; one step is
    `grad_accum` micro-batches, DeepSpeed steps the optimizer at the accumulation boundary."""

    def connect(self, device: torch.device) -> None:
        cuda = device.type == "cuda"
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")  # before the import
        clear_stale_build_locks()
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        self.deepspeed = deepspeed
        self.frameworks = {"deepspeed": deepspeed.__version__}
        t_init = time.perf_counter()
        deepspeed.init_distributed(dist_backend=self.loop.backend)
        self.init_seconds = time.perf_counter() - t_init
        acc = get_accelerator()
        if self.spec.precision == "fp16" and not acc.is_fp16_supported():
            raise RuntimeError(
                f"precision fp16 is not supported by DeepSpeed's {acc.device_name()} "
                "accelerator on this machine; use bf16 or fp32 for this strategy here"
            )
        if self.spec.precision == "bf16" and not acc.is_bf16_supported():
            raise RuntimeError(
                f"precision bf16 is not supported by DeepSpeed's {acc.device_name()}"
            )

    def build(self) -> torch.nn.Module:
        """ZeRO-3, for a model that initialises module by module (the GPT family, `hf:`, own
        models with `init`): built inside `deepspeed.zero.Init`, which partitions each module's
        parameters as soon as it is built, then initialised one module at a time, gathered
        whole for the while (trainscale.models.init). Whole on every rank otherwise."""
        spec, lp = self.spec, self.loop
        if stage(spec) != 3 or models.initialiser(spec.model, spec.own_model) is None:
            return lp.build_model()
        zero = self.deepspeed.zero
        config = ds_config(spec, load_fragment(spec.deepspeed_config))
        shape, classes = lp.info.shape, lp.info.num_classes
        # a first build, shapes only, imports what the builder imports (transformers imports
        # TorchDynamo, which rejects the torch.Tensor.__new__ that zero.Init puts in place)
        with torch.device("meta"):
            models.build(spec.model, shape, classes, spec.own_model)
        with zero.Init(config_dict_or_path=config):
            net = models.build(spec.model, shape, classes, spec.own_model)
        checkpointing.apply(net, spec.own_model, spec.activation_checkpointing)

        def gathered(tensors: list[torch.Tensor]):
            return zero.GatheredParameters([t for t in tensors if hasattr(t, "ds_id")],
                                           modifier_rank=0)  # fmt: skip

        models.initialise_module_wise(net, spec.model, spec.own_model, spec.seed, gathered)
        self.built = "zero.Init"
        return net

    def wrap(self, net: torch.nn.Module) -> None:
        spec = self.spec
        self.zero_estimate = zero_estimate_bytes(spec, net)
        self.config = ds_config(spec, load_fragment(spec.deepspeed_config))
        t_init = time.perf_counter()
        params = net.parameters()
        if spec.offload != "none":
            opt = cpu_adam(spec, params)
            self.loop.optimizer_implementation = "cpu-adam"
        else:
            opt = self.loop.make_optimizer(params)
        self.engine, _, _, _ = self.deepspeed.initialize(
            model=net, optimizer=opt, config=self.config
        )
        self.init_seconds += time.perf_counter() - t_init
        if spec.compile:  # DeepSpeed's own: the module compiled in place, at its first call
            self.engine.compile()
        self.eval_model = self.net = self.engine
        self.input_dtype = None if self.loop.tokens else self.dtype  # ids stay integers
        self.micro = spec.per_worker_batch_size // spec.grad_accum
        self.breakdown_sum = dict.fromkeys(TIMERS, 0.0)
        self.steady_steps = 0  # a diverged run stops early
        self.engine.train()

    def losses_per_step(self) -> int:
        return self.world_size * self.spec.grad_accum

    def epoch_starts(self, epoch: int) -> None:
        self.steady = epoch > 1  # DeepSpeed's own breakdown, over the steady epochs

    def step(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        lp, engine, m = self.loop, self.engine, self.micro
        loss_sum = torch.zeros((), device=lp.device)
        for x, y in zip(xs.split(m), ys.split(m), strict=True):
            x = x if self.input_dtype is None else x.to(self.input_dtype)
            loss = loss_of(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            loss_sum += loss.detach()
        if self.steady:
            self.steady_steps += 1
            snap = engine.get_wall_clock_timers()
            for k, name in TIMERS.items():
                self.breakdown_sum[k] += snap.get(name, 0.0)
        return loss_sum

    def exposed(self, shard: Shard) -> dict:
        lp, dtype = self.loop, self.dtype
        if why := replica_skipped(self.spec):  # ZeRO's point: the whole model may not fit
            return block(lp.rec.epochs, None, None, skipped=why)
        replica = lp.build_model().to(lp.device)
        replica = replica.to(dtype) if dtype else replica
        return measure_exposed_communication(
            "replica", lp.rec.epochs, compiled(replica, self.spec),
            make_optimizer(self.spec, replica.parameters()),  # not the run's: unrecorded
            lp.sample_batches(self.micro, self.input_dtype), lp.device,
            grad_accum=self.spec.grad_accum,
        )  # fmt: skip

    def skipped_steps(self) -> int | None:
        """Steps DeepSpeed's fp16 loss scaler skipped on an overflow (its own count)."""
        return int(self.engine.skipped_steps) if self.spec.precision == "fp16" else None

    def finish(self) -> None:
        n = self.steady_steps
        self.extra_memory = {"zero_estimate_bytes": self.zero_estimate}
        self.extra_blocks = {
            "deepspeed": {
                "config": self.config,
                "fragment": self.spec.deepspeed_config,
                "init_seconds": self.init_seconds,
                "breakdown_ms": {k: v / n if n else None for k, v in self.breakdown_sum.items()},
            }
        }

    # Without teardown, as every torchrun worker here ends (Plugin.teardown): besides gloo's
    # exit deadlock, DeepSpeed's CPU backend sometimes aborts in its atexit teardown
    # ("terminate called without an active exception").


def main(spec: RunSpec, out: str) -> None:
    run(ZeRO, spec, out)


def build_ops(cpu_adam: bool = False) -> None:
    """Compile the ops DeepSpeed JIT-builds on first use into TORCH_EXTENSIONS_DIR, once, so
    no run pays (or measures) the compile: the `deepspeed_ops` rule calls this, and with
    `cpu_adam` (a study with offload cells) the `deepspeed_cpu_adam` rule, for CPU Adam."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    clear_stale_build_locks()
    import deepspeed.ops  # noqa: F401  (fills __compatible_ops__)
    from deepspeed.accelerator import get_accelerator

    names = ["ShareMemCommBuilder"] if get_accelerator().device_name() == "cpu" else []
    names = ["CPUAdamBuilder"] if cpu_adam else names
    for name in names:
        builder = cpu_adam_builder() if cpu_adam else get_accelerator().create_op_builder(name)
        if builder is None or not builder.is_compatible():
            print(f"{name}: not compatible with this machine, DeepSpeed will not use it")
            continue
        t0 = time.perf_counter()
        builder.load()
        print(f"{name} ({builder.absolute_name()}): ready in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    if sys.argv[1:] not in (["--build-ops"], ["--build-ops", "cpu-adam"]):
        raise SystemExit(
            "usage: python -m trainscale.runners.torch.deepspeed_zero --build-ops [cpu-adam]"
        )
    # in a container study the ops are built by the image's toolchain for its torch
    container.reenter("trainscale.runners.torch.deepspeed_zero", sys.argv[1:])
    build_ops(cpu_adam=sys.argv[2:] == ["cpu-adam"])

"""PyTorch: one process (`torch`), nn.DataParallel (`torch-dp`), DistributedDataParallel
(`torch-ddp`) and fully sharded data parallelism (`torch-fsdp`, FSDP2 `fully_shard` over the
model's blocks); the last two launched by torchrun, gloo on CPU, NCCL on GPU.

Plug-ins on the PyTorch loop (torch_loop.py), which trains, times and records them.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainscale.models import torch_models as models
from trainscale.models.init import on_meta, to_empty
from trainscale.plan import catalog
from trainscale.plan.matrix import RunSpec
from trainscale.runners.torch.exposed import measure_exposed_communication
from trainscale.runners.torch.plugin import Plugin, Shard
from trainscale.runners.torch.torch_loop import run
from trainscale.runners.torch.torch_speed import compiled

# DDP warns when a 1-input-channel conv's weight gradient has other strides than its bucket
# view; it costs one small copy per step, and the message would fill every log.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")

#: strategies that run one process per worker under torchrun
DISTRIBUTED = catalog.names(runner="pytorch", one_process=False)


def shard(
    net: torch.nn.Module,
    dtype: torch.dtype | None,
    compile: bool = False,
    own=None,
    mesh=None,
    offload: bool = False,
) -> torch.nn.Module:
    """FSDP2: every top-level block with parameters is one shard unit (its parameters are
    all-gathered just before it runs and freed after; blocks that share a parameter are one
    unit, `shard_units`), the root takes the rest. `precision`
    becomes the policy: parameters and compute in `dtype`, gradients reduced in fp32 so the
    update matches DDP's; the optimizer keeps fp32 shards. With `compile`, each block's
    forward is compiled after it is sharded, so FSDP's hooks (all-gather, reduce-scatter) run
    eagerly around compiled blocks (compiling the sharded root, or a block with its hooks,
    builds no graph: FSDP keeps TorchDynamo out of its hooks and all they call). `mesh`: the
    DeviceMesh to shard over (torch-fsdp-tp: its dp dimension); None: every rank. `offload`
    (matrix offload params): FSDP2's CPUOffloadPolicy, every shard, its gradient and its
    optimizer state kept on the host, each unit's parameters copied to the device to run.

    Resharding after forward (freeing a unit's gathered parameters until its backward gathers
    them again) saves memory only where there is something to shard: over one rank a shard is
    the whole parameter, so no unit reshards (its backward would copy it again for nothing).
    Over several, every unit but the last to run reshards: its backward comes right after
    its forward, so torchtitan keeps it gathered, as FSDP2 keeps the root."""
    # imported here: torch.distributed.fsdp loads TorchDynamo and DTensor (~1 s), which only
    # torch-fsdp uses, and every torch run would pay it at start
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    # pinned host memory for the copies to a GPU; without one, pinning has no device to ask
    pin = torch.cuda.is_available()
    offload_policy = CPUOffloadPolicy(pin_memory=pin) if offload else OffloadPolicy()
    kw = {"mesh": mesh, "mp_policy": policy, "offload_policy": offload_policy}
    over = mesh.size() if mesh is not None else dist.get_world_size()
    blocks = models.blocks(net, own)
    units = shard_units(blocks)
    last = last_unit(units, blocks)
    for unit in units:
        reshard = over > 1 and unit is not last
        fully_shard(unit if len(unit) > 1 else unit[0], reshard_after_forward=reshard, **kw)
    if compile:
        compile_blocks(models.blocks(net, own))
    fully_shard(net, **kw)
    return net


def materialise(net: torch.nn.Module, device: torch.device, spec: RunSpec) -> None:
    """A model built on the meta device, once sharded or split: each rank's storage for its
    own share on `device` (`to_empty`), then the model's initialisation, module by module, from
    the run's seed (trainscale.models.init): the weights a whole build starts from. Nothing to
    do for a model built whole."""
    if on_meta(net):
        to_empty(net, device)
        models.initialise_module_wise(net, spec.model, spec.own_model, spec.seed)


def compile_blocks(blocks: list[torch.nn.Module]) -> None:
    """torch.compile each block's forward in place, after sharding or splitting has laid its
    hooks around it (torchtitan's per-block compile)."""
    for block in blocks:
        block.forward = torch.compile(block.forward)


def last_unit(
    units: list[list[torch.nn.Module]], blocks: list[torch.nn.Module]
) -> list[torch.nn.Module] | None:
    """Of `shard_units(blocks)`, the unit that runs last in the forward pass: the one holding
    the last of `blocks` with parameters (a GPT's head, in its tied embedding's unit, which
    `shard_units` puts first)."""
    order = {id(b): i for i, b in enumerate(blocks)}
    return max(units, key=lambda unit: max(order[id(b)] for b in unit), default=None)


def shard_units(blocks: list[torch.nn.Module]) -> list[list[torch.nn.Module]]:
    """The blocks with parameters, grouped into FSDP units: a block alone, or with the blocks it
    shares a parameter with (a GPT's head reuses its token embedding's matrix), which FSDP2 must
    gather as one unit (`fully_shard([a, b])`); in the order of their first block."""
    units: list[list[torch.nn.Module]] = []
    unit_of: dict[int, list[torch.nn.Module]] = {}  # id(parameter) -> its unit
    for block in blocks:
        params = [id(p) for p in block.parameters()]
        if not params:
            continue
        shared = next((unit_of[i] for i in params if i in unit_of), None)
        unit = shared if shared is not None else []
        if shared is None:
            units.append(unit)
        unit.append(block)
        unit_of.update(dict.fromkeys(params, unit))
    return units


class OneProcess(Plugin):
    """`torch`: the model as it is; `torch-dp`: nn.DataParallel over `workers` GPUs."""

    grouped = False

    @property
    def device_count(self) -> int:
        return self.spec.workers

    def wrap(self, net: torch.nn.Module) -> None:
        spec, cuda = self.spec, self.loop.cuda
        if spec.strategy == "torch-dp" and spec.workers > max(1, torch.cuda.device_count()):
            raise RuntimeError(
                f"torch-dp with workers={spec.workers} needs {spec.workers} GPUs, "
                f"found {torch.cuda.device_count()}"
            )
        self.eval_model = net.to(self.loop.device)
        self.model = compiled(net, spec)  # torch-dp takes no compile (speed_options)
        if spec.strategy == "torch-dp":
            ids = list(range(spec.workers)) if cuda else None
            self.model = torch.nn.DataParallel(net, device_ids=ids)
        self.opt = self.loop.make_optimizer(self.model.parameters())
        self.scaler = torch.amp.GradScaler(self.loop.device.type, enabled=spec.precision == "fp16")


class DataParallel(Plugin):
    """`torch-ddp`: DDP's bucketed all-reduce; `torch-fsdp`: FSDP2 shards (`shard`). With
    `compile`, DDP wraps the compiled model (its backward is one compiled graph, so DDP's
    bucket all-reduces start when it ends); FSDP2 compiles each sharded block's forward."""

    def build(self) -> torch.nn.Module:
        """torch-fsdp: on the meta device where the model initialises module by module."""
        return self.loop.build_model(meta=self.spec.strategy == "torch-fsdp")

    def wrap(self, net: torch.nn.Module) -> None:
        lp = self.loop
        self.fsdp = self.spec.strategy == "torch-fsdp"
        self.eval_model = self.net = net if on_meta(net) else net.to(lp.device)
        if self.fsdp:
            offload = self.spec.offload == "params"
            self.model = shard(net, self.dtype, self.spec.compile, self.spec.own_model,
                               offload=offload)  # fmt: skip
            materialise(net, torch.device("cpu") if offload else lp.device, self.spec)
            self.dtype = None  # FSDP casts parameters and inputs itself: no autocast
        else:
            step_net = compiled(net, self.spec)  # torch.compile(DDP(net)) here traces nothing
            self.model = DDP(step_net, device_ids=[lp.device.index] if lp.cuda else None)
        self.opt = lp.make_optimizer(self.model.parameters())
        self.scaler = torch.amp.GradScaler(lp.device.type, enabled=self.spec.precision == "fp16")

    def exposed(self, shard: Shard) -> dict:
        lp = self.loop
        k = self.spec.grad_accum
        return measure_exposed_communication(
            "fsdp" if self.fsdp else "ddp", lp.rec.epochs, self.model, self.opt,
            lp.sample_batches(shard.batch // k), lp.device,
            self.dtype, self.scaler, grad_accum=k,
        )  # fmt: skip


def main(spec: RunSpec, out: str) -> None:
    run(DataParallel if spec.strategy in DISTRIBUTED else OneProcess, spec, out)

"""Initial weights that do not depend on where the model lives: module by module, each module
from a seed of its own.

Why: the sharding strategies (torch-fsdp, torch-tp, torch-fsdp-tp) build the model on the meta
device, shard it, and only then give each rank storage for its own share (`to_empty`), as
torchtitan does, so that no rank ever holds the whole model; ZeRO-3 builds it inside
`deepspeed.zero.Init`. Their weights must still equal a plain build's under the same seed, or
their losses could not be compared with torch's and DDP's. One random stream drawn over the
whole model cannot be replayed shard by shard, so the initial weights are defined per module:

- every module that holds parameters or buffers of its own (a tied matrix counts once, for
  the first module that holds it) is initialised by the model's own rule (`Init`: GPT-2's for
  the GPT family, transformers' `_init_weights` for `hf:` models, the `init` of an own model);
- the rule runs on a host *twin* of the module, whose tensors are whole and fresh (NaN, so a
  tensor the rule leaves unset is caught; an integer or bool buffer, a mask or `position_ids`,
  has no NaN: the rule runs on a second twin filled with ones, and an element that differs
  from the first twin's zeros was left unset), with torch's CPU generator seeded from the
  run's seed and the module's name (the CPU one alone: the twin is on the host, and the
  device generators stay the run's, seeded once at its start, so a run's dropout stream on a
  GPU does not depend on when its model was built);
- each rank keeps its share of the twin's values: the whole of a plain tensor, its local
  piece of a DTensor (as `distribute_tensor` lays it), or ZeRO-3's partition.

One module is whole on the host at a time (the largest: a token embedding). The plain build
goes through the same pass, so the weights are equal by construction at any world size and
layout, and they do not depend on the device (the twin is always on the host).
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

#: A model's own initialisation of one module: `init(model, module, name)` sets every parameter
#: and buffer `module` holds itself (not its children's), in place, drawing from torch's global
#: generator; `model` is the whole model (its configuration, its depth), `name` the module's
#: qualified name in it.
Init = Callable[[nn.Module, nn.Module, str], None]

#: gathers a module's own parameters whole for the time of the `with` (ZeRO-3's partitions),
#: or None where they are whole or DTensors already
Gather = Callable[[list[torch.Tensor]], AbstractContextManager]


def module_seed(seed: int, name: str) -> int:
    """The generator's seed for module `name` of a run seeded `seed` (63 bits of a SHA-256)."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def initialise(net: nn.Module, init: Init, seed: int, gather: Gather | None = None) -> None:
    """Set every parameter and buffer of `net` in place, module by module (module docstring);
    ValueError naming the tensor where `init` leaves one unset."""
    seen: set[int] = set()
    for name, module in net.named_modules():
        own = [(k, t) for k, t in _tensors(module) if id(t) not in seen]
        if not own:
            continue
        with gather([t for _, t in own]) if gather else nullcontext(), torch.no_grad():
            values = _initialised(net, module, name, init, seed, 0)
            exact = [k for k, t in own if not (t.is_floating_point() or t.is_complex())]
            other = _initialised(net, module, name, init, seed, 1) if exact else {}
            for key, tensor in own:
                value = values[key]
                unset = bool(value.isnan().any()) if key not in exact else \
                    not torch.equal(value, other[key])  # fmt: skip
                if unset:
                    raise ValueError(
                        f"{name or 'the model'}.{key}: the model's initialisation "
                        f"({getattr(init, '__qualname__', init)}) left it unset; it must set "
                        "every parameter and buffer each module holds itself"
                    )
                _fill(tensor, value)
        seen.update(id(t) for _, t in own)


def _initialised(
    net: nn.Module, module: nn.Module, name: str, init: Init, seed: int, exact_fill: int
) -> dict[str, torch.Tensor]:
    """`init` run on a twin of `module` (floating tensors NaN, the others `exact_fill`), from
    the module's seed on the CPU generator alone, put back after: its tensors by name."""
    twin = _twin(module, exact_fill)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(module_seed(seed, name))
        init(net, twin, name)
    return dict(_tensors(twin))


def to_empty(net: nn.Module, device: torch.device | str) -> None:
    """`net.to_empty(device)` that keeps a parameter two modules share one parameter (a tied
    head and embedding): `to_empty` gives each holder a new tensor of its own."""
    first: dict[int, tuple[nn.Module, str]] = {}
    ties = []
    for module in net.modules():
        for key, p in module._parameters.items():
            if p is not None:
                if id(p) in first:
                    ties.append((module, key, first[id(p)]))
                else:
                    first[id(p)] = (module, key)
    net.to_empty(device=device)
    for module, key, (holder, held) in ties:
        module._parameters[key] = holder._parameters[held]


def on_meta(net: nn.Module) -> bool:
    """Whether `net` was built on the meta device (no storage yet)."""
    return any(t.is_meta for t in _all_tensors(net))


def _tensors(module: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """The parameters and buffers `module` holds itself, by attribute name."""
    for key, t in [*module._parameters.items(), *module._buffers.items()]:
        if t is not None:
            yield key, t


def _all_tensors(net: nn.Module) -> Iterable[torch.Tensor]:
    yield from net.parameters()
    yield from net.buffers()


def _twin(module: nn.Module, exact_fill: int = 0) -> nn.Module:
    """A shallow copy of `module` whose own tensors are fresh, whole and on the host (NaN where
    they are floating point, `exact_fill` where not): what `init` writes. Its children are the
    module's own (an `Init` sets only the module's tensors). A module FSDP2 wrapped copies as
    its plain class."""
    twin = copy.copy(module)
    twin._parameters = {
        k: None if p is None else nn.Parameter(_fresh(p, exact_fill), requires_grad=p.requires_grad)
        for k, p in module._parameters.items()
    }
    twin._buffers = {
        k: None if b is None else _fresh(b, exact_fill) for k, b in module._buffers.items()
    }
    return twin


def _fresh(t: torch.Tensor, exact_fill: int) -> torch.Tensor:
    fill = math.nan if t.is_floating_point() or t.is_complex() else exact_fill
    return torch.full(tuple(t.shape), fill, dtype=t.dtype, device="cpu")


def _fill(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """Copy the whole `value` into `tensor`: all of it, or this rank's share of a DTensor."""
    if hasattr(tensor, "placements"):  # a DTensor (FSDP2's shard, a tensor-parallel split)
        from torch.distributed.tensor import distribute_tensor

        share = distribute_tensor(
            value.to(tensor.device), tensor.device_mesh, tensor.placements, src_data_rank=None
        )
        tensor.to_local().copy_(share.to_local())
    else:
        tensor.copy_(value)

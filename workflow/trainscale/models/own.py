"""The user's own models (config `models:`, trainscale.plan.preflight.own_models): their builders
called with the keywords trainscale promises, in PyTorch and in Keras, and their blocks.

The contract (docs/own-model.md): keywords only, `build(input_shape=(C, H, W), classes=K,
**kwargs)` for images and `build(vocab_size=V, seq_len=T, **kwargs)` for tokens, returning a
model that returns logits; the Keras twin takes the same keywords (PyTorch's (C, H, W) shape)
and is fed channels-last images. Everything else (optimizer, precision, seeds, sharding,
measurement) stays trainscale's, so an own model is compared exactly as the built-ins are.
"""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Sequence

from trainscale.plan.runspec import OwnModel


def builder_call(input: str, shape: tuple[int, ...], classes: int) -> dict:
    """The keywords a builder is called with for data of `shape` and `classes` (the vocabulary
    of a token set, whose shape is (seq_len,))."""
    if input == "tokens":
        return {"vocab_size": classes, "seq_len": shape[0]}
    return {"input_shape": tuple(shape), "classes": classes}


def resolved(own: OwnModel, which: str):
    """The callable `which` ("torch", "keras" or "tp_plan") of `own`, its `code:` folders on
    sys.path first (a job's PYTHONPATH has them already; an in-process caller may not)."""
    for folder in reversed(own.code):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    return pkgutil.resolve_name(getattr(own, which))


def build_torch(own: OwnModel, shape: tuple[int, ...], classes: int):
    """The user's PyTorch model, freshly initialised (seed torch first)."""
    return resolved(own, "torch")(**builder_call(own.input, shape, classes), **own.builder_kwargs)


def build_keras(own: OwnModel, shape: tuple[int, ...], classes: int):
    """The user's Keras twin (a tf-keras 2 model)."""
    return resolved(own, "keras")(**builder_call(own.input, shape, classes), **own.builder_kwargs)


def model_blocks(net, attr: str) -> Sequence:
    """The modules `net.<attr>` holds, in order: an nn.Sequential, an nn.ModuleList or a list
    of modules; TypeError naming `attr` otherwise."""
    from torch import nn

    held = getattr(net, attr)
    blocks = list(held) if isinstance(held, (nn.Sequential, nn.ModuleList, list, tuple)) else None
    if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
        raise TypeError(
            f"{type(net).__name__}.{attr} is a {type(held).__name__}, not a sequence of "
            "modules (nn.Sequential or nn.ModuleList)"
        )
    return blocks


def submodule(net, path: str):
    """The module at `path` (config `models.NAME.embedding` / `head`): attribute names and
    indices into sequences, dotted ("blocks.0.tokens"; "blocks.-1.linear" counts from the
    end). An attribute may be a property returning a module (an `hf:` model's `embedding`).
    AttributeError naming the part of `path` that is missing."""
    from torch import nn

    module = net
    for i, atom in enumerate(path.split(".")):
        at = ".".join(path.split(".")[: i + 1])
        if atom.lstrip("-").isdigit() and isinstance(module, (nn.Sequential, nn.ModuleList)):
            if not -len(module) <= int(atom) < len(module):
                raise AttributeError(f"{at}: {len(module)} modules, no index {atom}")
            module = module[int(atom)]
        elif isinstance(getattr(module, atom, None), nn.Module):
            module = getattr(module, atom)
        else:
            raise AttributeError(f"{at}: {type(module).__name__} has no module {atom!r}")
    return module

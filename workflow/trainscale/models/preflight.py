"""The pre-flight check of the user's own models, run in a child process by
trainscale.plan.preflight.own_models before any job: `python -m trainscale.models.preflight REQUEST
ANSWER` reads the request (a JSON file: `code` and each model's entry with the (shape, classes)
pairs it will be built at) and writes the answer to the file ANSWER. Both are files of their
own because the user's code may print, log or warn anywhere, at import, build or forward:
stdout and stderr are only a log.

For each model it imports the builder, builds the model on the meta device (no memory, no
time) at every pair, runs a forward pass of a batch of 2 there (under fake tensors) and checks
the logits' shape, counts the parameters, reads `blocks` (and whether running them in order
gives the logits, which torch-pipeline needs), the modules `embedding` and `head` name (an
nn.Embedding and an nn.Linear), and builds the Keras twin to compare its count.
Every problem is one line naming the config key, the model and the fix; none ends in a bare
traceback.
"""

from __future__ import annotations

import json
import pkgutil
import sys
from pathlib import Path

import torch
from torch import nn

from trainscale.models.own import builder_call, model_blocks, submodule
from trainscale.models.torch_models import fake_forward
from trainscale.plan.preflight.own_models import pair_key

#: a twin's parameter count may differ from the PyTorch model's by this share at most
TWIN_TOLERANCE = 0.01


def resolve(path: str, key: str, code: list[str], env: str) -> tuple[object, str | None]:
    """(the callable `module:attr` names, None) or (None, why not, naming `key`)."""
    module, _, attr = path.partition(":")
    try:
        return pkgutil.resolve_name(path), None
    except ModuleNotFoundError as e:
        return None, (
            f"{key}: module {e.name!r} not found on the jobs' path (code: {code}); is the "
            f"package installed in {env} or listed under code:?"
        )
    except AttributeError:
        return None, f"{key}: {module} has no {attr!r}; check the name after ':' in {path!r}"
    except Exception as e:  # the user's module raised while importing
        return None, f"{key}: importing {module} raised {type(e).__name__}: {e}"


def expected(entry: dict, shape: list[int], classes: int) -> tuple[int, ...]:
    return (2, shape[0], classes) if entry.get("input") == "tokens" else (2, classes)


def check_torch(name: str, entry: dict, code: list[str]) -> dict:
    key = f"models.{name}.torch"
    out = {"problems": [], "block_count": 0, "batchnorm": False, "params": {}}
    build, why = resolve(entry["torch"], key, code, "envs/torch.yaml")
    if why:
        out["problems"].append(why)
        return out
    if entry.get("init"):  # called at run time, module by module (trainscale.models.init)
        init, why = resolve(entry["init"], f"models.{name}.init", code, "envs/torch.yaml")
        if why or not callable(init):
            out["problems"].append(why or f"models.{name}.init: {entry['init']} is not callable")
            return out
    tokens = entry.get("input") == "tokens"
    for shape, classes in entry["pairs"]:
        kw = builder_call(entry.get("input") or "image", tuple(shape), classes)
        try:
            with torch.device("meta"):
                net = build(**kw, **(entry.get("kwargs") or {}))
        except Exception as e:
            out["problems"].append(f"{key}: {entry['torch']}({_args(kw)}) raised {_said(e)}")
            return out
        if not isinstance(net, nn.Module):
            out["problems"].append(
                f"{key}: {entry['torch']} returned a {type(net).__name__}, not a torch.nn.Module"
            )
            return out
        x = torch.zeros(2, *shape, dtype=torch.long if tokens else torch.float, device="meta")
        want = expected(entry, shape, classes)
        try:
            with fake_forward():
                logits = net(x)
        except Exception as e:
            out["problems"].append(
                f"models.{name}: a forward pass of a batch of shape {tuple(x.shape)} on the "
                f"meta device raised {_said(e)}"
            )
            return out
        if not isinstance(logits, torch.Tensor) or not _fits(tuple(logits.shape), want, tokens):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            what = "(batch, seq_len, vocab)" if tokens else "(batch, classes)"
            out["problems"].append(
                f"models.{name}: logits of shape {got} for a batch of shape {tuple(x.shape)}; "
                f"expected {want}, {what}: the model must return logits over the data set's "
                f"{'vocabulary' if tokens else 'classes'}"
            )
            return out
        out["params"][pair_key(tuple(shape), classes)] = sum(p.numel() for p in net.parameters())
        out["batchnorm"] = any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules()
        )
        if entry.get("blocks"):
            out["block_count"], why = _blocks(net, entry["blocks"], x, want, name)
            if why:
                out["problems"].append(why)
                return out
        out["problems"] += _vocabulary_modules(net, entry, name)
        if out["problems"]:
            return out
    return out


def _vocabulary_modules(net: nn.Module, entry: dict, name: str) -> list[str]:
    """A problem line for `embedding` or `head` where it names no module of the model, or a
    module tensor parallelism cannot split by vocabulary (an nn.Embedding, an nn.Linear)."""
    out = []
    for key, kind in (("embedding", nn.Embedding), ("head", nn.Linear)):
        if not entry.get(key):
            continue
        try:
            module = submodule(net, entry[key])
        except AttributeError as e:
            out.append(f"models.{name}.{key}: {entry[key]!r} names no module of the model ({e})")
            continue
        if not isinstance(module, kind):
            out.append(
                f"models.{name}.{key}: {entry[key]!r} is a {type(module).__name__}, not a "
                f"torch.nn.{kind.__name__}: name the {kind.__name__} itself (tensor "
                "parallelism splits its matrix by vocabulary)"
            )
    return out


def _fits(got: tuple, want: tuple, tokens: bool) -> bool:
    """The logits' shape is the one expected; a token model's vocabulary may be larger than the
    data's (a config's vocab_size padded, or a tokenizer's whose ids the data uses in part)."""
    if tokens and len(got) == 3:
        return got[:2] == want[:2] and got[2] >= want[2]
    return got == want


def _blocks(net: nn.Module, attr: str, x: torch.Tensor, want: tuple, name: str):
    """(how many blocks torch-pipeline may cut between, or 0 where running them in order does
    not give the logits; a problem line where `blocks` is not a sequence of modules)."""
    try:
        blocks = model_blocks(net, attr)
    except (AttributeError, TypeError) as e:
        return 0, f"models.{name}.blocks: {e}"
    y = x
    try:
        for b in blocks:
            with fake_forward():
                y = b(y)
    except Exception:
        return 0, None  # FSDP may still shard them; the pipeline cannot cut them
    return (len(blocks) if _fits(tuple(y.shape), want, x.dtype == torch.long) else 0), None


def check_keras(name: str, entry: dict, code: list[str], torch_params: dict) -> list[str]:
    key = f"models.{name}.keras"
    build, why = resolve(entry["keras"], key, code, "envs/tensorflow.yaml")
    if why:
        return [why]
    for shape, classes in entry["pairs"]:
        kw = builder_call(entry.get("input") or "image", tuple(shape), classes)
        try:
            model = build(**kw, **(entry.get("kwargs") or {}))
            if not model.built:
                tokens = entry.get("input") == "tokens"
                model.build((None, *shape) if tokens else (None, *shape[1:], shape[0]))
            count = int(model.count_params())
        except Exception as e:
            return [f"{key}: {entry['keras']}({_args(kw)}) raised {_said(e)}"]
        theirs = torch_params.get(pair_key(tuple(shape), classes))
        if theirs and abs(count - theirs) > TWIN_TOLERANCE * theirs:
            return [
                f"{key}: the Keras twin has {count:,} parameters, the PyTorch model "
                f"{theirs:,} (more than {TWIN_TOLERANCE:.0%} apart at {_args(kw)}): a twin "
                "must have the same layers"
            ]
    return []


def _args(kw: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kw.items())


def _said(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".strip().splitlines()[0]


def main(argv: list[str]) -> None:
    asked, answered = argv
    request = json.loads(Path(asked).read_text())
    code = request["code"]
    answer = {}
    for name, entry in request["models"].items():
        facts = check_torch(name, entry, code)
        if not facts["problems"] and entry.get("keras"):
            facts["problems"] += check_keras(name, entry, code, facts["params"])
        answer[name] = facts
        line = ", ".join(f"{v:,} at {k}" for k, v in facts["params"].items())
        print(f"trainscale: models.{name}: {line or 'not built'} parameters", file=sys.stderr)
    tmp = Path(answered).with_suffix(".partial")
    tmp.write_text(json.dumps(answer))
    tmp.replace(answered)  # whole or absent: a child killed half-way leaves no answer


if __name__ == "__main__":
    main(sys.argv[1:])

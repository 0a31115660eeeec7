"""The user's own models (config `models:`): what each is, frozen into the run spec, and the
pre-flight check that stops a study before any job when one cannot run.

A model is a name under `models:` with a PyTorch builder ("module:callable"), optionally a
Keras twin, keyword arguments, what it eats (`input`), the attribute holding its blocks and,
for tensor parallelism, the module paths of its token embedding and LM head.
The check imports the builders, builds each model on the meta device for every data set it is
paired with, and reads back the facts the matrix needs (blocks, BatchNorm, parameters). It
runs in a child process (trainscale.models.preflight): only studies with their own models pay
for importing torch (and TensorFlow for a twin), and the Snakefile's own process stays free of
both. The child is given its request and the file for its answer; what the user's code prints,
logs or warns goes to a log beside the cache, so it never corrupts the answer. The answer is
cached by the models' entries, the data shapes and the source files, so a repeated
`snakemake -n` does not import anything again.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainscale.plan.preflight import child
from trainscale.plan.runspec import OwnModel
from trainscale.plan.studyconfig import StudyConfig, thawed

#: where pre-flight answers are kept, under the directory Snakemake runs in
CACHE = Path(".cache") / "trainscale" / "own-models"
#: the pre-flight child builds every model on the meta device: seconds, not minutes
TIMEOUT_SECONDS = 600


class OwnModelError(ValueError):
    """A model of `models:` that cannot run; the message names the key and the fix."""


def names(study: StudyConfig) -> list[str]:
    """The names of `matrix.model` that are the user's own (under `models:`)."""
    return [m for m in study.matrix.get("model") or [] if m in study.models]


def code_paths(code: Sequence[str]) -> tuple[str, ...]:
    """Config `code`'s folders, absolute (from the directory Snakemake runs in)."""
    return tuple(os.path.abspath(p) for p in code)


def pairs(name: str, shapes: dict[str, list[tuple]]) -> list[list]:
    """[[shape, classes], ...] the model `name` will be built at (`shapes`: by model, the data
    sets of its kind that a cell pairs it with: trainscale.plan.matrix.data_shapes)."""
    return [list(p) for p in sorted({(tuple(s), k) for s, k in shapes.get(name, [])})]


def _entry(entry: Mapping[str, Any]) -> dict:
    """A `models:` entry as the check reads it, the schema's defaults filled in or not: the
    same request, and cache key, before and after the config's defaults."""
    entry = thawed(entry)
    full = {**entry, "kwargs": entry.get("kwargs") or {}, "input": entry.get("input") or "image"}
    return {k: v for k, v in full.items() if v is not None}


def _sources(code: Sequence[str], models: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The source files the check depends on: every .py under `code:`, and the package (or
    module) of each builder, found on `code:` and the import path without importing it."""
    files = {str(p) for folder in code_paths(code) for p in Path(folder).rglob("*.py")}
    search = [*code_paths(code), *sys.path]
    for entry in models.values():
        for key in ("torch", "keras", "tp_plan", "init"):
            top = (entry.get(key) or "").split(":")[0].split(".")[0]
            spec = importlib.machinery.PathFinder.find_spec(top, search) if top else None
            origin = getattr(spec, "origin", None)
            if not origin or not origin.endswith(".py"):
                continue
            if spec.submodule_search_locations:  # a package: all of it
                files |= {str(p) for p in Path(origin).parent.rglob("*.py")}
            else:
                files.add(origin)
    return sorted(files)


def _key(request: dict, files: list[str]) -> str:
    text = json.dumps(request, sort_keys=True) + child.sources_digest(files)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check(study: StudyConfig, shapes: dict[str, list[tuple]]) -> dict:
    """The pre-flight answer for every own model of the matrix: {name: {"problems": [...],
    "block_count", "batchnorm", "params": {"shape/classes": n}, "keras_params": {...}}},
    from the cache or from a child process (trainscale.models.preflight)."""
    own = names(study)
    if not own:
        return {}
    request = {
        "code": list(code_paths(study.code)),
        "models": {n: {**_entry(study.models[n]), "pairs": pairs(n, shapes)} for n in own},
    }
    key = _key(request, _sources(study.code, study.models))
    path = CACHE / f"{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    return _ask_child(request, path, CACHE / f"{key}.log", own)


def _ask_child(request: dict, path: Path, log: Path, own: list[str]) -> dict:
    """The pre-flight child's answer (trainscale.plan.preflight.child: what the user's code prints,
    logs or warns goes to `log`, never into it), cached at `path` when clean."""
    answer, why = child.ask("trainscale.models.preflight", request, log, request["code"],
                            TIMEOUT_SECONDS)  # fmt: skip
    if answer is None:
        raise OwnModelError(
            f"models: the pre-flight check of {', '.join(own)} stopped: {why} (its whole "
            f"output: {log})"
        )
    if not any(a["problems"] for a in answer.values()):
        path.write_text(json.dumps(answer, sort_keys=True))
    return answer


def problems(answer: dict) -> list[str]:
    return [line for a in answer.values() for line in a["problems"]]


def frozen(name: str, study: StudyConfig, answer: dict, shape: tuple, classes: int) -> OwnModel:
    """The OwnModel of `name` for a run at (shape, classes), with the pre-flight's facts."""
    entry, facts = thawed(study.models[name]), answer[name]
    return OwnModel(
        name=name, torch=entry["torch"], keras=entry.get("keras"),
        kwargs=json.dumps(entry.get("kwargs") or {}, sort_keys=True),
        input=entry.get("input") or "image", blocks=entry.get("blocks"),
        tp_plan=entry.get("tp_plan"), init=entry.get("init"), code=code_paths(study.code),
        embedding=entry.get("embedding"), head=entry.get("head"),
        block_count=facts["block_count"], batchnorm=facts["batchnorm"],
        params=facts["params"].get(pair_key(shape, classes), 0),
    )  # fmt: skip


def pair_key(shape: tuple, classes: int) -> str:
    return f"{'x'.join(map(str, shape))}/{classes}"

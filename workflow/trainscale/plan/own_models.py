"""The user's own models (config `models:`): what each is, frozen into the run spec, and the
pre-flight check that stops a study before any job when one cannot run.

A model is a name under `models:` with a PyTorch builder ("module:callable"), optionally a
Keras twin, keyword arguments, what it eats (`input`) and the attribute holding its blocks.
The check imports the builders, builds each model on the meta device for every data set it is
paired with, and reads back the facts the matrix needs (blocks, BatchNorm, parameters). It
runs in a child process (trainscale.models.preflight): only studies with their own models pay
for importing torch (and TensorFlow for a twin), and the Snakefile's own process stays free of
both. Its answer is cached by the models' entries, the data shapes and the source files, so a
repeated `snakemake -n` does not import anything again.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainscale.plan.catalog_models import Model

#: where pre-flight answers are kept, under the directory Snakemake runs in
CACHE = Path(".cache") / "trainscale" / "own-models"
WORKFLOW = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class OwnModel:
    """One entry of `models:` as a run needs it (paths absolute), with the facts the pre-flight
    check found: `block_count` (len of `blocks`, 0 without), `batchnorm` and `params` (at the
    run's data set)."""

    name: str
    torch: str
    keras: str | None
    kwargs: str  # the builders' keyword arguments as JSON text (sorted keys): frozen, hashable
    input: str
    blocks: str | None
    tp_plan: str | None
    code: tuple[str, ...]
    block_count: int = 0
    batchnorm: bool = False
    params: int = 0

    @property
    def builder_kwargs(self) -> dict:
        return json.loads(self.kwargs)

    @classmethod
    def from_dict(cls, d: dict) -> OwnModel:
        return cls(**{**d, "code": tuple(d.get("code", ()))})

    def row(self) -> Model:
        """The catalog row the matrix's constraints read (blocks bound the pipeline stages)."""
        return Model(self.name, self.block_count, 1, self.batchnorm, self.params, (), 0,
                     self.input, tp_plan=self.tp_plan is not None)  # fmt: skip


class OwnModelError(ValueError):
    """A model of `models:` that cannot run; the message names the key and the fix."""


def names(config: dict) -> list[str]:
    """The names of `matrix.model` that are the user's own (under `models:`)."""
    own = config.get("models") or {}
    return [m for m in (config.get("matrix") or {}).get("model") or [] if m in own]


def code_paths(config: dict) -> tuple[str, ...]:
    return tuple(os.path.abspath(p) for p in config.get("code") or [])


def pairs(config: dict, name: str, shapes: dict[str, list[tuple]]) -> list[list]:
    """[[shape, classes], ...] the model `name` will be built at: the data sets of its kind."""
    kind = config["models"][name].get("input") or "image"
    return [list(p) for p in sorted({(tuple(s), k) for s, k in shapes.get(kind, [])})]


def _sources(config: dict) -> list[str]:
    """The source files the check depends on: every .py under `code:`, and the package (or
    module) of each builder, found on `code:` and the import path without importing it."""
    files = {str(p) for folder in code_paths(config) for p in Path(folder).rglob("*.py")}
    search = [*code_paths(config), *sys.path]
    for entry in (config.get("models") or {}).values():
        for key in ("torch", "keras", "tp_plan"):
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
    h = hashlib.sha256(json.dumps(request, sort_keys=True).encode())
    for f in files:
        st = os.stat(f)
        h.update(f"{f}:{st.st_mtime_ns}:{st.st_size}".encode())
    return h.hexdigest()[:32]


def check(config: dict, shapes: dict[str, list[tuple]]) -> dict:
    """The pre-flight answer for every own model of the matrix: {name: {"problems": [...],
    "block_count", "batchnorm", "params": {"shape/classes": n}, "keras_params": {...}}},
    from the cache or from a child process (trainscale.models.preflight)."""
    own = names(config)
    if not own:
        return {}
    request = {
        "code": list(code_paths(config)),
        "models": {n: {**config["models"][n], "pairs": pairs(config, n, shapes)} for n in own},
    }
    path = CACHE / f"{_key(request, _sources(config))}.json"
    if path.is_file():
        return json.loads(path.read_text())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(WORKFLOW), *request["code"], *filter(None, [env.get("PYTHONPATH")])]
    )
    p = subprocess.run(
        [sys.executable, "-m", "trainscale.models.preflight"], input=json.dumps(request),
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        raise OwnModelError(f"models: the pre-flight check of {', '.join(own)} stopped: {tail[0]}")
    answer = json.loads(p.stdout)
    if not any(a["problems"] for a in answer.values()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(answer, sort_keys=True))
    return answer


def problems(answer: dict) -> list[str]:
    return [line for a in answer.values() for line in a["problems"]]


def frozen(name: str, config: dict, answer: dict, shape: tuple, classes: int) -> OwnModel:
    """The OwnModel of `name` for a run at (shape, classes), with the pre-flight's facts."""
    entry, facts = config["models"][name], answer[name]
    return OwnModel(
        name=name, torch=entry["torch"], keras=entry.get("keras"),
        kwargs=json.dumps(entry.get("kwargs") or {}, sort_keys=True),
        input=entry.get("input") or "image", blocks=entry.get("blocks"),
        tp_plan=entry.get("tp_plan"), code=code_paths(config),
        block_count=facts["block_count"], batchnorm=facts["batchnorm"],
        params=facts["params"].get(pair_key(shape, classes), 0),
    )  # fmt: skip


def pair_key(shape: tuple, classes: int) -> str:
    return f"{'x'.join(map(str, shape))}/{classes}"

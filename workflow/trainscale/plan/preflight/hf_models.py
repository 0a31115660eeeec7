"""Hugging Face models by their config (`matrix.model: hf:NAME`), planned as own models.

NAME is a config shipped with trainscale (trainscale/models/hf_configs/NAME.json: facts only,
from each model's published architecture) or the user's config.json, a path relative to the
directory Snakemake runs in (`hf:configs/my-llama.json`). Each becomes an entry of `models:`
whose builder is trainscale.models.hf:build, so the pre-flight check, the cache, the catalog's
rules and every PyTorch-family runner treat it as any own model. Its name in run paths and on
command lines is safe: `hf-<stem>-<first 8 hex of the config's sha256>`, so two different
configs never share a path; the run spec keeps the name as written (`kwargs.name`).

The planner reads the config as JSON (no transformers here: the Snakefile's process stays free
of torch); only the runner and the pre-flight child import transformers.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

from trainscale.plan.studyconfig import StudyConfig

PREFIX = "hf:"
#: configs that ship with trainscale, by stem
SHIPPED = Path(__file__).resolve().parents[2] / "models" / "hf_configs"
BUILDER = "trainscale.models.hf:build"
TP_PLAN = "trainscale.models.hf:tp_plan"
INIT = "trainscale.models.hf:init_module"


class HFConfigError(ValueError):
    """An `hf:` model that cannot be planned; the message names the key and the fix."""


def shipped() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.json"))


def is_hf(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def config_path(written: str, where: str = "matrix.model") -> Path:
    """The config file `hf:NAME` names: a shipped stem, else a path from the working dir."""
    name = written.removeprefix(PREFIX)
    if (SHIPPED / f"{name}.json").is_file():
        return SHIPPED / f"{name}.json"
    path = Path(name)
    if name.endswith(".json") and path.is_file():
        return path.resolve()
    raise HFConfigError(
        f"{where}: {written!r} is neither a config shipped with trainscale "
        f"({', '.join(PREFIX + s for s in shipped())}) nor a config.json found at {path} "
        "(a path relative to the directory Snakemake runs in; docs/models.md)"
    )


def parsed(path: str | Path) -> dict:
    """The config file's JSON, parsed once per version of the file (the planner asks for it
    in every cell of the matrix); not to be changed by the caller."""
    st = Path(path).stat()
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    return json.loads(Path(path).read_text())


def read(path: Path, where: str) -> dict:
    try:
        facts = parsed(path)
    except (OSError, ValueError) as e:
        raise HFConfigError(f"{where}: {path} is not a JSON config: {e}") from None
    missing = [k for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                           "num_attention_heads") if k not in facts]  # fmt: skip
    if missing:
        raise HFConfigError(f"{where}: {path} lacks {', '.join(missing)} (a transformers config)")
    return facts


def safe_name(written: str, path: Path) -> str:
    """`hf-<stem>-<hash>`: within the run paths' pattern [A-Za-z0-9._-]."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-") or "config"
    return f"hf-{stem}-{hashlib.sha256(path.read_bytes()).hexdigest()[:8]}"


def expand(study: StudyConfig) -> StudyConfig:
    """`study` with each `hf:NAME` of matrix.model (and of exclude and faults) replaced by its
    safe name, and an own-model entry under `models:` for it. Idempotent."""
    if not any(is_hf(m) for m in study.matrix.get("model") or ()):
        return study
    return StudyConfig.from_filled(_expanded(study.as_dict()))


def _expanded(config: dict) -> dict:
    """`expand` on the config as given (a dict)."""
    matrix = config.get("matrix") or {}
    names, models = {}, dict(config.get("models") or {})
    for i, w in enumerate(matrix["model"]):
        if not is_hf(w):
            continue
        where = f"matrix.model[{i}]"
        path = config_path(w, where)
        facts = read(path, where)
        names[w] = safe_name(w, path)
        models[names[w]] = {
            "torch": BUILDER, "input": "tokens", "blocks": "layers", "tp_plan": TP_PLAN,
            "init": INIT, "embedding": "embedding", "head": "head",
            "kwargs": {"config": str(path), "name": w,
                       "architecture": (facts.get("architectures") or ["?"])[0]},
        }  # fmt: skip
    out = {**config, "models": models}
    out["matrix"] = {**matrix, "model": [names.get(m, m) for m in matrix["model"]]}
    if matrix.get("exclude"):
        out["matrix"]["exclude"] = [_renamed(e, names) for e in matrix["exclude"]]
    if config.get("faults"):
        out["faults"] = [{**f, "match": _renamed(f.get("match") or {}, names)}
                         for f in config["faults"]]  # fmt: skip
    return out


def _renamed(values: dict, names: dict[str, str]) -> dict:
    return {**values, "model": names.get(values["model"], values["model"])} if "model" in values \
        else values  # fmt: skip


def facts_of(entry: dict) -> dict | None:
    """The config's facts of an expanded `models:` entry (None for other own models)."""
    if entry.get("torch") != BUILDER:
        return None
    return parsed(entry["kwargs"]["config"])


def framework_why_not(strategy: str, runtime: str, kwargs: dict) -> str | None:
    """Why the `hf:` model of these builder keywords has no way to run under `strategy`."""
    name = kwargs["name"]
    if runtime == "tensorflow":
        return (f"{strategy}: {name} is a Hugging Face PyTorch model, which has no Keras twin: "
                "the TensorFlow strategies train a Keras model")  # fmt: skip
    if strategy == "torch-pipeline":
        return (f"torch-pipeline: {name}'s decoder layers take the position embeddings "
                "and the mask from the model's forward: they are not stages")  # fmt: skip
    return None


def shape_why_not(values: dict, kwargs: dict) -> str | None:
    """Why a cell's seq_len or tp does not fit the config of the `hf:` model (the catalog's
    rules about tp have passed: tp > 1 here is a tensor-parallel strategy's)."""
    facts, name = parsed(kwargs["config"]), kwargs["name"]
    seq_len, tp = values["seq_len"], values["tp"]
    if seq_len > facts.get("max_position_embeddings", seq_len):
        return (f"{name}: seq_len {seq_len} is above the config's max_position_embeddings "
                f"{facts['max_position_embeddings']}")  # fmt: skip
    heads = facts["num_attention_heads"]
    kv = facts.get("num_key_value_heads") or heads
    if tp > 1 and (heads % tp or kv % tp):
        return (f"{name}: tp {tp} must divide its {heads} attention heads and {kv} key-value "
                "heads")  # fmt: skip
    return None


def vocabulary_problems(
    study: StudyConfig, vocab_of: dict[str, int], left: set[tuple[str, str, int]]
) -> list[str]:
    """A line per (hf: model, token data set) with a cell of the matrix (`left`: the (model,
    data set, seq_len) matrix.exclude leaves, trainscale.plan.exclusions) whose ids do not fit
    the config's vocab_size, naming both numbers (checked before any job)."""
    paired = {(model, ds) for model, ds, _ in left}
    out = []
    for model in study.matrix.get("model") or ():
        entry = study.models.get(model) or {}
        facts = facts_of(entry) if entry else None
        if facts is None:
            continue
        for ds in study.matrix.get("dataset") or ():
            v = vocab_of.get(ds) if (model, ds) in paired else None
            if v is not None and v > facts["vocab_size"]:
                out.append(
                    f"matrix.model: {entry['kwargs']['name']} has vocab_size "
                    f"{facts['vocab_size']:,}, below the {v:,} ids of data set {ds!r}: give "
                    "a config whose vocab_size covers the data, or token data of a smaller "
                    "vocabulary"
                )
    return out

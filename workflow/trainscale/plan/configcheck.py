"""A study's config against the schema, for people: every place it breaks the schema, with the
key as written in YAML and a likely fix, the names of its data sets and models, the user's own
models built in a pre-flight child; YAML's boolean words put back and the schema's defaults
filled. `study_plan` (plan.study) checks a config with these before it plans; `trainscale
check` (plan.check) with them too.
"""

from __future__ import annotations

import copy
import sys

from trainscale.data import imagecheck, names
from trainscale.plan import catalog, cluster
from trainscale.plan.matrix import DEFAULT_SEQ_LEN, data_shapes
from trainscale.plan.preflight import hf_models, own_models
from trainscale.plan.runspec import ConfigError
from trainscale.plan.studyconfig import StudyConfig

#: the words YAML 1.1 reads as booleans where unquoted (`check: off` is `check: false`)
YAML_WORDS = {False: "off", True: "on"}


def yaml_booleans_as_words(config: dict, schema: dict) -> None:
    """Where a key's values are words (an enum of strings) that list "off" or "on" and not the
    boolean, a boolean written there is put back as the word, in place: YAML reads an unquoted
    `off` (or `no`, `false`) as false, so `memory: {check: off}`, as the docs write it, would
    be refused. Call before `config_problems`."""

    def visit(value, sub: dict) -> None:
        if isinstance(value, dict):
            for key, prop in sub.get("properties", {}).items():
                if isinstance(value.get(key), bool) and YAML_WORDS[value[key]] in prop.get(
                    "enum", ()
                ):
                    value[key] = YAML_WORDS[value[key]]
                elif key in value:
                    visit(value[key], prop)
        elif isinstance(value, list) and isinstance(sub.get("items"), dict):
            for item in value:
                visit(item, sub["items"])

    visit(config, schema)


def config_problems(config: dict, schema: dict) -> list[str]:
    """Every place `config` breaks the config schema, one line each, for people: the key as
    written in YAML (matrix.strategy[0]), the value, what is allowed, and a likely fix for a
    typo ("did you mean ..."). Empty when the config is valid."""
    import difflib

    import jsonschema

    def where(path) -> str:
        out = ""
        for p in path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out or "<top level>"

    lines = []
    validator = jsonschema.Draft202012Validator(schema)
    for e in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path))):
        key = where(e.path)
        if e.validator == "enum":
            allowed = [str(v) for v in e.validator_value]
            close = difflib.get_close_matches(str(e.instance), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if isinstance(e.instance, bool):  # YAML's off/no/on/yes, unquoted
                hint = "; YAML reads an unquoted off/no (on/yes) as a boolean: quote the word"
            lines.append(f"{key}: {e.instance!r} is not one of {', '.join(allowed)}{hint}")
        elif e.validator == "additionalProperties":
            known = sorted(e.schema.get("properties", {}))
            extra = sorted(set(e.instance) - set(known))
            for k in extra:
                close = difflib.get_close_matches(k, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
                where_k = f"{key}.{k}" if e.path else k
                lines.append(f"{where_k}: unknown key; {hint}")
        elif e.validator == "pattern":
            lines.append(
                f"{key}: {e.instance!r} has characters not allowed here (the value becomes a "
                f"path or part of a command line); allowed: {e.validator_value}"
            )
        else:
            lines.append(f"{key}: {e.message}")
    lines += imagecheck.problems(config)
    lines += _model_names(config)
    lines += cluster.problems(config.get("env") or {})
    if lines:
        return lines
    return _own_model_problems(config, schema)


def _own_model_problems(config: dict, schema: dict) -> list[str]:
    """The own models' pre-flight problems (each model's parameters printed for people), on the
    config with its defaults, as the matrix meets it: the same pre-flight request."""
    seq_lens = (config.get("matrix") or {}).get("seq_len") or [DEFAULT_SEQ_LEN]
    filled = copy.deepcopy(config)
    fill_defaults(filled, schema)
    try:
        study = StudyConfig.from_filled(filled)
    except ConfigError:  # repeats' max under its min: the plan names it, as it always did
        return []
    try:
        answer = own_models.check(study, data_shapes(study, seq_lens))
    except own_models.OwnModelError as e:
        return [str(e)]
    for name, facts in answer.items():
        tokens = study.models[name].get("input") == "tokens"
        at = "seq_len {}, vocabulary {}" if tokens else "input {}, {} classes"
        counts = "; ".join(
            f"{n:,} parameters at " + at.format(*k.split("/")) for k, n in facts["params"].items()
        )
        print(f"trainscale: models.{name}: {counts or 'not built'}", file=sys.stderr)
    return own_models.problems(answer)


def _model_names(config: dict) -> list[str]:
    """matrix.model names that are neither built-in nor under `models:`, with the likely fix."""
    model_names = names.matrix_names(config, "model")
    hf = [n for n in model_names if hf_models.is_hf(n)]
    out = []
    for name in hf:  # a Hugging Face config: shipped, or the user's file
        where = f"matrix.model[{model_names.index(name)}]"
        try:
            hf_models.read(hf_models.config_path(name, where), name)
        except hf_models.HFConfigError as e:
            out.append(str(e))
    return out + names.unknown(
        config, "model", catalog.MODELS, [*(config.get("models") or {}), *hf], "models",
        lambda name: f"your own model: models.{name}: {{torch: 'pkg.mod:build'}}, "
        "docs/own-model.md; a Hugging Face config: hf:NAME, docs/models.md",
    )  # fmt: skip


def fill_defaults(config: dict, schema: dict) -> None:
    """Fill in the schema's defaults, in place, exactly as snakemake.utils.validate does (its
    default-setting `properties` on the same Draft 2020-12 validator), from the schema already
    read for `config_problems`: Snakemake's own validate reads the schema file again with the
    pure-Python YAML reader and builds a reference registry for it, a tenth of a second of
    every Snakemake start. Call after `config_problems` found none."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    check_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, subschema):
        for name, prop in properties.items():
            if "default" in prop:
                instance.setdefault(name, prop["default"])
        yield from check_properties(validator, properties, instance, subschema)

    jsonschema.validators.extend(base, {"properties": set_defaults})(schema).validate(config)

"""The metrics schema's msgspec types (metrics.read's first check): they refuse whatever the schema
refuses, mutation by mutation (they may refuse more: the schema's validators decide those files),
and the tables read through them equal the tables read without them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import msgspec
import orjson
import pandas as pd
import pytest
from test_aggregate import failed_record, ok_record, spec_for, write

from trainscale.analysis import metrics_tables
from trainscale.measure import metrics, metrics_types

#: values each field of a record is replaced with, one at a time
MUTANTS = [None, True, False, -1, 0, 0.5, 2.0, 2**40, "", "x", "ok", "failed", [], [1], ["x"], {},
           {"x": 1}]  # fmt: skip


def example(node: dict, defs: dict) -> object:
    """A value schema `node` accepts, with every optional property filled in."""
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **node}
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return next((v for v in node["enum"] if v is not None), None)
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    kind = next((k for k in ("object", "array", "integer", "number", "string", "boolean")
                 if k in kinds), "null")  # fmt: skip
    if kind in ("integer", "number"):
        low = node.get("minimum", node.get("exclusiveMinimum", 0) + 1)
        value = max(low, 1) if kind == "integer" else max(low, 0) + 0.5
        return min(value, node.get("maximum", value))
    if kind == "string":
        return "x" * max(1, node.get("minLength", 1))
    if kind == "boolean":
        return True
    if kind == "array":
        item = example(node["items"], defs) if "items" in node else 1
        return [item] * max(1, node.get("minItems", 1))
    if kind == "object":
        if node.get("properties"):
            return {k: example(v, defs) for k, v in node["properties"].items()}
        extra = node.get("additionalProperties", True)
        return {"key": 1 if extra is True else example(extra, defs)}
    return None


def filled(record: dict, node: dict, defs: dict) -> dict:
    """`record` with every property the schema describes and it lacks added."""
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **node}
    for key, sub in (node.get("properties") or {}).items():
        if key not in record:
            record[key] = example(sub, defs)
        elif isinstance(record[key], dict):
            resolved = {**defs[sub["$ref"].rsplit("/", 1)[1]], **sub} if "$ref" in sub else sub
            if "properties" in resolved:
                filled(record[key], resolved, defs)
    return record


def bases() -> dict[str, dict]:
    schema = metrics._schema()
    ok = ok_record(spec_for("torch-ddp", 2), [0.5, 0.5])
    full = filled(json.loads(json.dumps(ok)), schema, schema["$defs"])
    return {"ok": ok, "failed": failed_record(spec_for("torch", 1)), "every field": full}


def accepted_by_schema(record: object) -> bool:
    try:
        metrics.validate(record)  # type: ignore[arg-type]
    except metrics.MetricsError:
        return False
    return True


def accepted_by_types(record: object) -> bool:
    decode = metrics._typed_check()
    assert decode is not None
    try:
        decode(orjson.dumps(record))
    except msgspec.DecodeError:
        return False
    return True


def places(value: object, path: tuple = ()) -> Iterator[tuple]:
    """The path of every dict entry and list item under `value`."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(
        value, list) else ()  # fmt: skip
    for key, sub in items:
        yield (*path, key)
        yield from places(sub, (*path, key))


def mutants(record: dict) -> Iterator[tuple[str, dict]]:
    """(what changed, the record changed): each place set to each of MUTANTS, removed, and
    each object given a field it does not describe."""
    for path in [(), *places(record)]:
        copy = orjson.loads(orjson.dumps(record))
        *head, last = path or (None,)
        parent = copy
        for key in head:
            parent = parent[key]
        target = parent[last] if path else copy
        if isinstance(target, dict):
            target["not_in_the_schema"] = 1
            yield f"{path} + a field", orjson.loads(orjson.dumps(copy))
            del target["not_in_the_schema"]
        if not path:
            continue
        for value in MUTANTS:
            parent[last] = value
            yield f"{path} = {value!r}", orjson.loads(orjson.dumps(copy))
        parent[last] = target
        if isinstance(parent, dict):
            del parent[last]
            yield f"{path} removed", copy


def test_the_shipped_schema_is_expressed_as_types():
    """The types are None where a schema keyword has no msgspec form: every file would then
    take the slow path. (A YAML slip such as `description: x, if any` inside a flow mapping
    makes a key `if any`; the types refuse the unknown keyword, so this test finds it.)"""
    msgspec.json.Decoder(metrics_types.record_type(metrics._schema()))  # raises, saying which
    assert metrics._typed_check() is not None


@pytest.mark.parametrize("kind", ["ok", "failed", "every field"])
def test_the_types_accept_the_records_runs_write(kind):
    record = bases()[kind]
    assert accepted_by_schema(record)
    assert accepted_by_types(record)  # the fast path is the common path


@pytest.mark.parametrize("kind", ["ok", "failed", "every field"])
def test_the_types_never_accept_what_the_schema_refuses(kind):
    tried = refused = 0
    for change, record in mutants(bases()[kind]):
        tried += 1
        if not accepted_by_types(record):
            refused += 1
            continue
        assert accepted_by_schema(record), f"the types accepted what the schema refuses: {change}"
    assert tried > 200 and refused > tried / 2  # the mutations reach the checks


def test_the_tables_equal_those_read_without_the_types(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    paths = []
    for strategy, workers in (("torch", 1), ("torch-ddp", 2)):
        for r in range(2):
            s = spec_for(strategy, workers, repeat=r)
            paths.append(write(runs, s, ok_record(s, [0.5 + r, 0.6])))
    s = spec_for("torch", 1, repeat=2)
    paths.append(write(runs, s, failed_record(s)))
    s = spec_for("torch", 1, repeat=3)  # NaN, as json writes it: metrics.read's json reads it
    nan = ok_record(s, [0.5, 0.6])
    nan["epochs"][1]["test_loss"] = math.nan
    (runs / s.path).mkdir(parents=True)
    (runs / s.path / "metrics.json").write_text(json.dumps(nan))
    paths.append(runs / s.path / "metrics.json")
    for name, text in (("truncated", '{"schema": "trainscale.metrics/1"'),
                       ("off-schema", json.dumps({**nan, "status": "done"}))):  # fmt: skip
        bad = runs / "strategy~torch" / name / "metrics.json"
        bad.parent.mkdir(parents=True)
        bad.write_text(text)
        paths.append(bad)
    files = [str(p) for p in paths]

    fast = metrics_tables._tables_of(files)
    monkeypatch.setattr(metrics, "_typed_check", lambda: None)
    slow = metrics_tables._tables_of(files)
    pd.testing.assert_frame_equal(fast[0], slow[0])
    pd.testing.assert_frame_equal(fast[1], slow[1])
    assert fast[2] == slow[2] and len(fast[2]) == 2
    assert len(fast[0]) == 6 and fast[0]["status"].tolist().count("ok") == 5


def test_a_file_with_nan_is_refused_by_the_types_and_read_by_the_validators(tmp_path):
    s = spec_for("torch", 1)
    rec = ok_record(s, [0.5, 0.6])
    rec["epochs"][1]["test_loss"] = math.nan
    text = json.dumps(rec).encode()
    with pytest.raises(msgspec.DecodeError):
        metrics._typed_check()(text)  # type: ignore[misc]
    path = Path(tmp_path / "metrics.json")
    path.write_bytes(text)
    assert math.isnan(metrics.read(path)["epochs"][1]["test_loss"])


@pytest.mark.parametrize(
    ("node", "values"),
    [
        ({"type": "string", "enum": ["a", None]}, ["a", None, "b", 1]),  # null: not a string
        ({"type": ["integer", "null"], "minimum": 0}, [0, -1, None, 1.5, True, "0"]),
        ({"type": "number", "exclusiveMinimum": 0, "minimum": 0}, [0, 0.1, 1, -1, None]),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
         [[], [1], [1, 2, 3], ["x"], [1.5]]),
        ({"enum": ["auto", True, False]}, ["auto", True, False, "true", 0, None]),
        ({"type": "string", "minLength": 1}, ["", "x", None]),
    ],
)  # fmt: skip
def test_a_field_s_type_accepts_only_what_its_schema_accepts(node, values):
    """Each keyword's msgspec form, on the values beside and across its edges."""
    import jsonschema

    schema = {"type": "object", "required": ["x"], "properties": {"x": node}}
    decode = msgspec.json.Decoder(metrics_types._top_type(schema)).decode
    for value in values:
        by_schema = jsonschema.Draft202012Validator(schema).is_valid({"x": value})
        try:
            decode(orjson.dumps({"x": value}))
            by_types = True
        except msgspec.DecodeError:
            by_types = False
        assert by_types == by_schema, (node, value)


@pytest.mark.parametrize(
    "node",
    [
        {"type": "string", "enum": ["", "x"], "minLength": 1},  # a bound beside an enum
        {"type": "string", "format": "date-time"},  # a keyword the types do not state
        {"type": "object", "required": ["a"], "additionalProperties": False},
    ],
)
def test_what_the_types_cannot_state_is_refused_when_they_are_built(node):
    schema = {"type": "object", "properties": {"x": node}}
    with pytest.raises(metrics_types.Unexpressible):
        metrics_types._top_type(schema)

"""The compiled schema check (trainscale.measure.schema_check) never passes what the metrics
schema rejects: records broken at random places are checked against jsonschema itself."""

import copy
import math
import random

import jsonschema
import pytest
from test_metrics import epochs, spec_dict

from trainscale.measure import metrics, schema_check
from trainscale.measure.schema_check import Unsupported, compile_check

#: Values a broken record gets in place of one of its own.
ODD = [None, True, False, 0, 1, -1, 1.0, 0.5, -0.5, 1e300, math.inf, "", "x", "ok", [], [1],
       [None], {}, {"a": 1}]  # fmt: skip


def _records() -> list[dict]:
    ok = metrics.ok_record(spec_dict(), epochs(), 0.5)
    ok["model"]["params"] = 10
    failed = metrics.failure_record(
        spec_dict(), "oom", "out of memory", metrics.utc_now(), 1.0, {"command": "x"}
    )
    return [ok, failed]


def _places(node, path=()):
    """Every (path, value) in a record, containers included."""
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _places(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _places(v, (*path, i))


def _broken(record: dict, rng: random.Random) -> dict:
    """`record` with one value replaced, one key removed or one unknown key added."""
    out = copy.deepcopy(record)
    path, _ = rng.choice([p for p in _places(out) if p[0]])
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    how = rng.random()
    if how < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
    elif how < 0.25 and isinstance(parent, dict):
        parent["unknown_key"] = 1
    else:
        parent[path[-1]] = rng.choice(ODD)
    return out


def test_the_metrics_schema_compiles_and_passes_valid_records():
    check = metrics._fast_check()
    assert check.__module__ != "fastjsonschema"  # the schema uses only keywords it checks
    assert all(check(r) for r in _records())


def test_a_broken_record_is_never_passed():
    check = metrics._fast_check()
    full = metrics._validator()
    rng = random.Random(0)
    records = _records()
    passed = refused = 0
    for _ in range(400):
        rec = _broken(rng.choice(records), rng)
        if check(rec):
            passed += 1
            assert not list(full.iter_errors(rec)), rec  # passed: the schema accepts it too
        else:
            refused += 1
    assert refused > 200 and passed > 20  # both kinds were tried


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        ({"type": "integer", "minimum": 1}, 1, True),
        ({"type": "integer", "minimum": 1}, 0, False),
        ({"type": "integer"}, True, False),  # a boolean is no number
        ({"type": "integer"}, 1.0, False),  # valid in JSON Schema: left to jsonschema
        ({"type": ["number", "null"], "exclusiveMinimum": 0}, None, True),
        ({"type": ["number", "null"], "exclusiveMinimum": 0}, 0.0, False),
        ({"enum": ["auto", True, False]}, 1, False),  # 1 is not true
        ({"enum": ["auto", True, False]}, True, True),
        ({"const": "a"}, ["a"], False),
        ({"type": "array", "items": {"type": "string"}, "minItems": 1}, [], False),
        ({"type": "string", "minLength": 1}, "", False),
        ({"additionalProperties": {"type": "integer"}}, {"a": 1, "b": "x"}, False),
        ({"properties": {"a": {"type": "string"}}, "additionalProperties": False}, {"b": 1}, False),
        ({"required": ["a"], "properties": {"a": {}}}, {"a": None}, True),
        ({"required": ["a"]}, "not an object", True),  # required applies to objects only
    ],
)
def test_keywords(schema, value, expected):
    assert compile_check(schema)(value) is expected
    if expected:
        assert jsonschema.Draft202012Validator(schema).is_valid(value)


def test_if_then_else():
    schema = {
        "if": {"properties": {"status": {"const": "ok"}}},
        "then": {"properties": {"error": {"const": None}}},
        "else": {"properties": {"error": {"type": "string", "minLength": 1}}},
    }
    check = compile_check(schema)
    assert check({"status": "ok", "error": None})
    assert not check({"status": "ok", "error": "x"})
    assert check({"status": "failed", "error": "x"})
    assert not check({"status": "failed", "error": None})


@pytest.mark.parametrize(
    "schema",
    [
        {"pattern": "^a"},
        {"properties": {"a": {"anyOf": [{}]}}},
        {"if": {"properties": {"n": {"const": 1}}}, "then": {}},  # 1 or 1.0: not exact
        {"items": {"$ref": "#/$defs/x"}},
    ],
)
def test_a_keyword_it_does_not_check_is_refused(schema):
    with pytest.raises(Unsupported):
        schema_check.compile_check(schema)

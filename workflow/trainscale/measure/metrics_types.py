"""A JSON Schema (the metrics schema, workflow/schemas/metrics.schema.yaml) as msgspec types, so
that `metrics.read` parses and checks a file in one C call instead of orjson and then the compiled
validator (about half of reading, for a report of 100,000 files).

The types are derived from the schema, not written by hand. They only ever refuse more than the
schema does: a record they decode is one the schema accepts, and one they refuse (NaN as json
writes it, an integer written as 2.0, one beyond 64 bits) is for the schema's validators to
judge. Where the schema uses a keyword they cannot express there are no types (`decoder` gives
None). A field absent from a file is `msgspec.UNSET`, never None, so absent and null stay apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

import msgspec

#: the schema keywords the types express; a node with any other makes the whole schema
#: unexpressible (`decoder` returns None and every file takes metrics.read)
_HANDLED = {"type", "properties", "required", "additionalProperties", "items", "enum", "const",
            "minimum", "maximum", "exclusiveMinimum", "minItems", "maxItems", "minLength",
            "description", "$ref", "default"}  # fmt: skip


_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "minItems", "maxItems", "minLength"}


def _of_kind(value: object, kind: str) -> bool:
    """Whether a JSON value is of JSON Schema type `kind` (a boolean is no number)."""
    if isinstance(value, bool):
        return kind == "boolean"
    return {"null": value is None, "string": isinstance(value, str),
            "integer": isinstance(value, int),
            "number": isinstance(value, int | float)}.get(kind, False)  # fmt: skip


class Unexpressible(ValueError):
    """A schema construct the msgspec types cannot state."""


def _resolve(node: dict, defs: dict) -> dict:
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **node}
        del node["$ref"]
    return node


def _kinds(node: dict) -> list[str]:
    kinds = node.get("type", [])
    return [kinds] if isinstance(kinds, str) else list(kinds)


def _bounds(node: dict, kind: str) -> dict:
    """msgspec.Meta arguments for the node's bounds that apply to JSON `kind`."""
    meta: dict[str, Any] = {}
    if kind in ("integer", "number"):
        for key, arg in (("minimum", "ge"), ("maximum", "le"), ("exclusiveMinimum", "gt")):
            if key in node:
                meta[arg] = node[key]
        if "ge" in meta and "gt" in meta:  # both hold: the stricter one says it
            del meta["ge" if meta["gt"] >= meta["ge"] else "gt"]
    elif kind == "array":
        meta.update({arg: node[key] for key, arg in (("minItems", "min_length"),
                     ("maxItems", "max_length")) if key in node})  # fmt: skip
    elif kind == "string" and "minLength" in node:
        meta["min_length"] = node["minLength"]
    return meta


def _with(base: Any, meta: dict) -> Any:
    return Annotated[base, msgspec.Meta(**meta)] if meta else base


def _union(members: list[Any]) -> Any:
    return members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007


def _enum_type(values: list) -> Any:
    if not values:
        raise Unexpressible("an enum no value of its type meets")
    members: list[Any] = []
    text = [v for v in values if isinstance(v, str)]
    if text:
        members.append(Literal[tuple(text)])
    flags = {v for v in values if isinstance(v, bool)}
    if flags == {True, False}:
        members.append(bool)
    elif flags:
        raise Unexpressible(f"an enum of one boolean: {values}")
    if None in values:
        members.append(None)
    if len(text) + len(flags) + (None in values) != len(values):
        raise Unexpressible(f"an enum of numbers: {values}")
    return _union(members)


def _type(node: dict, defs: dict, name: str) -> Any:
    """The msgspec type of schema `node` (a field called `name`, for struct names)."""
    node = _resolve(node, defs)
    unknown = set(node) - _HANDLED
    if unknown:
        raise Unexpressible(f"{name}: {sorted(unknown)}")
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        bounded = set(node) & _BOUNDS
        if bounded:  # a value the bound refuses would pass as one of the listed
            raise Unexpressible(f"{name}: {sorted(bounded)} beside enum or const")
        if "type" in node:  # both hold: only the listed values of the listed types
            values = [v for v in values if any(_of_kind(v, k) for k in _kinds(node))]
        return _enum_type(values)
    kinds = _kinds(node)
    if not kinds:
        raise Unexpressible(f"{name}: no type")
    members = [_kind_type(node, defs, name, kind) for kind in kinds]
    return _union(members)


def _kind_type(node: dict, defs: dict, name: str, kind: str) -> Any:
    meta = _bounds(node, kind)
    if kind == "null":
        return None
    if kind == "string":
        return _with(str, meta)
    if kind == "boolean":
        return bool
    if kind == "integer":
        return _with(int, meta)
    if kind == "number":
        return _with(float, meta)
    if kind == "array":
        items = _type(node["items"], defs, f"{name}[]") if "items" in node else Any
        return _with(list[items], meta)
    if kind == "object":
        return _object_type(node, defs, name)
    raise Unexpressible(f"{name}: type {kind}")


def _object_type(node: dict, defs: dict, name: str, **options: Any) -> Any:
    """A struct of the node's properties (`options`: msgspec.defstruct's, as a tag), or a
    dict where it lists none."""
    extra = node.get("additionalProperties", True)
    props = node.get("properties")
    if not props:
        if node.get("required"):
            raise Unexpressible(f"{name}: required fields it does not describe")
        values = Any if extra is True else _type(extra, defs, f"{name}.*")
        return dict[str, values]
    required = set(node.get("required", ()))
    fields = []
    for key, sub in props.items():
        typ = _type(sub, defs, f"{name}.{key}")
        fields.append((key, typ) if key in required else (key, typ, msgspec.UNSET))
    if isinstance(extra, dict):
        raise Unexpressible(f"{name}: properties beside typed additionalProperties")
    for key in sorted(required - set(props)):  # required, described by no property: any value
        if extra is False:
            raise Unexpressible(f"{name}: {key} is required and not allowed")
        fields.append((key, Any))
    fields.sort(key=lambda f: len(f) == 3)  # required first, as msgspec asks
    return msgspec.defstruct(name.strip(".").replace(".", "_") or "Metrics", fields,
                             forbid_unknown_fields=extra is False, **options)  # fmt: skip


def _merged(base: dict, extra: dict, defs: dict) -> dict:
    """Schema `base` with `extra`'s constraints added (both must hold), for the branches of
    an if/then/else: types intersect, bounds add, properties merge field by field."""
    base = _resolve(base, defs)
    out = dict(base)
    for key, value in extra.items():
        if key == "properties":
            props = dict(base.get("properties", {}))
            for name, sub in value.items():
                if name not in props:  # new to the object: its additionalProperties decide
                    raise Unexpressible(f"allOf: {name} is not among the properties")
                props[name] = _merged(props[name], sub, defs)
            out["properties"] = props
        elif key == "type":
            kinds = [k for k in _kinds(base) if k in _kinds(extra)] if "type" in base else value
            if not kinds:
                raise Unexpressible(f"no type both allow: {base.get('type')} and {value}")
            out["type"] = kinds
        elif key == "const":
            out.pop("enum", None)
            out["const"] = value
        elif key in ("minItems", "minLength", "minimum", "exclusiveMinimum"):
            out[key] = max(value, base.get(key, value))
        else:
            raise Unexpressible(f"allOf: {key}")
    return out


def _top_type(schema: dict) -> Any:
    """The record's type: one struct, or, where the schema's allOf holds an if/then/else on
    one field's constant (`status: ok`), a union of structs told apart by that field's value,
    each with its branch's constraints."""
    defs = schema.get("$defs", {})
    top = {k: v for k, v in schema.items() if k not in ("$schema", "$id", "$defs", "allOf")}
    rules = schema.get("allOf", [])
    if not rules:
        return _type(top, defs, "")
    if len(rules) != 1 or set(rules[0]) - {"if", "then", "else"}:
        raise Unexpressible("allOf: more than one if/then/else")
    when, then, otherwise = (rules[0].get(k, {}) for k in ("if", "then", "else"))
    field, test = _only_property(when)
    if set(test) != {"const"} or not isinstance(test["const"], str):
        raise Unexpressible(f"allOf: if {when}")
    values = _resolve(top["properties"][field], defs).get("enum")
    if field not in top.get("required", ()) or not values or test["const"] not in values:
        raise Unexpressible(f"allOf: {field} is not a required enum holding {test['const']}")
    members = []
    for value in values:
        branch = then if value == test["const"] else otherwise
        node = _merged(top, branch, defs)
        # the field is the tag, which the union reads to choose the struct: not a field too
        node["properties"] = {k: v for k, v in node["properties"].items() if k != field}
        node["required"] = [k for k in node["required"] if k != field]
        members.append(_object_type(node, defs, f"Metrics_{value}", tag_field=field, tag=value))
    return Union[tuple(members)]  # noqa: UP007


def _only_property(node: dict) -> tuple[str, dict]:
    props = node.get("properties", {})
    if set(node) != {"properties"} or len(props) != 1:
        raise Unexpressible(f"allOf: if {node}")
    return next(iter(props.items()))


def decoder(schema: dict) -> Callable[[bytes], Any] | None:
    """A function from a file's bytes to its record as msgspec structs, raising
    msgspec.DecodeError (msgspec.ValidationError among them) where `schema` might refuse it;
    None where the schema uses something the types cannot express."""
    try:
        return msgspec.json.Decoder(record_type(schema)).decode
    except (TypeError, ValueError):  # Unexpressible, or a union msgspec cannot tell apart
        return None


def record_type(schema: dict) -> Any:
    """`schema` as a msgspec type; raises Unexpressible (or msgspec's TypeError) where it says
    what the types cannot."""
    return _top_type(schema)

"""A JSON Schema turned into one Python function, for the common case of a valid record read
from JSON: `compile_check(schema)(record)` is True only where the record follows the schema.

Reading 100,000 metrics files, the check runs for every one of them: fastjsonschema's
generated code took about 80 µs a record (a set of keys built and emptied per object, an
isinstance chain per value), more than parsing the file. This compiler writes one function of
plain tests on JSON's own types (a parsed file holds dict, list, str, int, float, bool and
None only), with no call per value: a fraction of that.

It may say False where the schema would accept (1.0 as an integer, 1 against an enum of 1.0, a
value of another Python type): the caller then asks the full validator, which decides and
words the errors. It never says True where the schema would reject. A schema with a keyword it
does not check raises `Unsupported` at compile time, so the caller keeps another validator
rather than skip a rule.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

#: JSON Schema's names for JSON's types -> the Python types json and orjson parse them into
#: (integer: int alone; bool is its own type, never a number).
TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
#: Keywords of JSON Schema 2020-12 that assert something and are not checked here.
ASSERTING = {"pattern", "patternProperties", "multipleOf", "uniqueItems", "oneOf", "anyOf",
             "not", "propertyNames", "dependentRequired", "dependentSchemas", "contains",
             "minContains", "maxContains", "prefixItems", "unevaluatedProperties",
             "unevaluatedItems", "minProperties", "maxProperties", "$ref", "$dynamicRef",
             "format"}  # fmt: skip
#: Number bounds: keyword -> the test a valid number passes.
NUMBER_BOUNDS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">",
                 "exclusiveMaximum": "<"}  # fmt: skip
#: Length bounds: keyword -> (the type measured, the test its length passes).
LENGTH_BOUNDS = {"minItems": (list, ">="), "maxItems": (list, "<="), "minLength": (str, ">="),
                 "maxLength": (str, "<=")}  # fmt: skip


class Unsupported(ValueError):
    """The schema uses a keyword this compiler does not check (use another validator)."""


class _Writer:
    """The function's source lines and the constants (type sets, enums, key sets) it reads."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, object] = {"_MISSING": object()}
        self._ids = itertools.count()

    def name(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def constant(self, value: object, prefix: str = "C") -> str:
        name = self.name(prefix)
        self.constants[name] = value
        return name

    def line(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)


def compile_check(schema: dict, exact: bool = False) -> Check:
    """The check of `schema` (references already inlined): True only for a valid value;
    `exact`: True exactly where it is valid (an `if`'s condition; Unsupported where this
    compiler cannot tell)."""
    w = _Writer()
    w.line(0, "def check(v0):")
    _emit(w, schema, "v0", 1, exact)
    w.line(1, "return True")
    namespace = dict(w.constants)
    exec(compile("\n".join(w.lines), "<trainscale.measure.schema_check>", "exec"), namespace)
    return namespace["check"]


def _emit(w: _Writer, node: dict, var: str, indent: int, exact: bool) -> None:
    """Lines that `return False` when `var` breaks `node`. `exact`: an `if`'s condition, whose
    check must be True exactly where the schema holds, not merely never where it fails."""
    if not isinstance(node, dict):
        raise Unsupported(f"a schema that is not an object: {node!r}")
    if unknown := ASSERTING & node.keys():
        raise Unsupported(f"keywords not checked here: {sorted(unknown)}")
    _emit_type(w, node, var, indent, exact)
    _emit_values(w, node, var, indent, exact)
    _emit_bounds(w, node, var, indent)
    _emit_object(w, node, var, indent, exact)
    if "items" in node:
        item = w.name("v")
        w.line(indent, f"if type({var}) is list:")
        w.line(indent + 1, f"for {item} in {var}:")
        _emit(w, node["items"], item, indent + 2, exact)
    for sub in node.get("allOf", ()):
        _emit(w, sub, var, indent, exact)
    if "if" in node:
        cond = w.constant(compile_check(node["if"], exact=True), "IF")
        w.line(indent, f"if {cond}({var}):")
        _emit(w, node.get("then", {}), var, indent + 1, exact)
        w.line(indent + 1, "pass")
        w.line(indent, "else:")
        _emit(w, node.get("else", {}), var, indent + 1, exact)
        w.line(indent + 1, "pass")


def _emit_type(w: _Writer, node: dict, var: str, indent: int, exact: bool) -> None:
    kinds = node.get("type")
    if kinds is None:
        return
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if exact and "integer" in kinds:
        raise Unsupported("an `if` on an integer (1.0 is one too)")
    allowed = {t for k in kinds for t in TYPES[k]}
    if len(allowed) == 1:
        w.line(indent, f"if type({var}) is not {w.constant(allowed.pop(), 'T')}:")
    else:
        w.line(indent, f"if type({var}) not in {w.constant(frozenset(allowed), 'T')}:")
    w.line(indent + 1, "return False")


def _emit_values(w: _Writer, node: dict, var: str, indent: int, exact: bool) -> None:
    """enum and const, as (type, value) pairs: 1 is not true, as in JSON."""
    values = node.get("enum", [node["const"]] if "const" in node else None)
    if values is None:
        return
    if exact and any(type(v) in (int, float) for v in values):
        raise Unsupported("an `if` on a number's value (1 is 1.0 too)")
    try:
        pairs = frozenset((type(v), v) for v in values)
    except TypeError as e:  # an object or array among the values
        raise Unsupported(f"an enum of objects or arrays: {values!r}") from e
    w.line(indent, "try:")
    w.line(indent + 1, f"if (type({var}), {var}) not in {w.constant(pairs, 'E')}:")
    w.line(indent + 2, "return False")
    w.line(indent, "except TypeError:")  # an object or array against plain values
    w.line(indent + 1, "return False")


def _emit_bounds(w: _Writer, node: dict, var: str, indent: int) -> None:
    """The bounds of numbers (not of booleans) and the lengths of strings and arrays."""
    tests = [f"{var} {op} {node[k]!r}" for k, op in NUMBER_BOUNDS.items() if k in node]
    if tests:
        w.line(indent, f"if type({var}) is int or type({var}) is float:")
        w.line(indent + 1, f"if not ({' and '.join(tests)}):")
        w.line(indent + 2, "return False")
    for key, (kind, op) in LENGTH_BOUNDS.items():
        if key in node:
            w.line(indent, f"if type({var}) is {w.constant(kind, 'T')} and not "
                           f"len({var}) {op} {int(node[key])}:")  # fmt: skip
            w.line(indent + 1, "return False")


def _emit_object(w: _Writer, node: dict, var: str, indent: int, exact: bool) -> None:
    """required, properties and additionalProperties (on objects; other values pass)."""
    props = node.get("properties", {})
    required = node.get("required", ())
    extra = node.get("additionalProperties", True)
    if not props and not required and (extra is True or extra == {}):
        return
    w.line(indent, f"if type({var}) is dict:")
    inner = indent + 1
    if required:
        w.line(inner, f"if not {w.constant(frozenset(required), 'K')} <= {var}.keys():")
        w.line(inner + 1, "return False")
    known = w.constant(frozenset(props), "K")
    if extra is False:
        w.line(inner, f"if not {var}.keys() <= {known}:")
        w.line(inner + 1, "return False")
    elif extra is not True and extra != {}:
        key, value = w.name("k"), w.name("v")
        w.line(inner, f"for {key}, {value} in {var}.items():")
        w.line(inner + 1, f"if {key} not in {known}:")
        _emit(w, extra, value, inner + 2, exact)
    for name, sub in props.items():
        value = w.name("v")
        w.line(inner, f"{value} = {var}.get({name!r}, _MISSING)")
        w.line(inner, f"if {value} is not _MISSING:")
        _emit(w, sub, value, inner + 1, exact)
        w.line(inner + 1, "pass")

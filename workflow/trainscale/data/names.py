"""Names in the study matrix that trainscale does not know, one line each with a likely fix.

Data sets (trainscale.data.imagecheck) and models (trainscale.plan.check) are named alike: a
built-in, or a key the user defines (`datasets:`, `models:`); a typo gets the closest known
name, and every line says how to define the name instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


def matrix_names(config: dict, axis: str) -> list:
    """matrix.<axis> as written (empty where it is not a list: the schema says why)."""
    names = (config.get("matrix") or {}).get(axis) or []
    return names if isinstance(names, list) else []


def unknown(config: dict, axis: str, builtins: Iterable[str], defined: Iterable[str],
            under: str, fix: Callable[[str], str]) -> list[str]:  # fmt: skip
    """matrix.<axis> names that are neither one of `builtins` nor a key of `under:`
    (`defined`); `fix(name)` says how to define one."""
    builtins = list(builtins)
    known = [*builtins, *defined]
    out = []
    for i, name in enumerate(matrix_names(config, axis)):
        if not isinstance(name, str) or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        out.append(
            f"matrix.{axis}[{i}]: {name!r} is not one of {', '.join(builtins)}, nor a name "
            f"under {under}:{hint} ({fix(name)})"
        )
    return out

"""How a comparison (trainscale.compare, trainscale.compare.references) is shown: a table on stdout,
JSON, a self-contained HTML page in the study report's style, and the rows of the report's
"Compared with …" section. Every figure is defined in trainscale.compare's docstring."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainscale.analysis.aggregate import human
from trainscale.compare.cellrow import Comparison
from trainscale.report.html import stylesheet, templates

PAGE = "compare.html.j2"
#: How each --ci is named where the comparison is shown.
CI_NAMES = {"steps": "steps and repeats, both studies' run-to-run spread pooled where alike "
                     "(the bootstrap where a side lacks step times)",
            "bootstrap": "bootstrap", "welch": "Welch's t"}  # fmt: skip


def _na(v) -> bool:
    return v is None


def _x(v) -> str:
    return "–" if _na(v) else f"{v:.3g}×"


def _signed_pct(v) -> str:
    return "–" if _na(v) else f"{100 * v:+.3g} %"


def _points(v) -> str:
    return "–" if _na(v) else f"{100 * v:+.3g} pt"


def _side(s: Mapping[str, Any] | None, reference: bool) -> str:
    if s is None:
        return "missing"
    if s["mean"] is None:
        return f"no ok run ({s['ok']}/{s['runs']})"
    if reference:
        return f"ref {human(s['mean'])}"
    ci = f" ± {human(s['ci95'])}" if s["ci95"] is not None else ""
    return f"{human(s['mean'])}{ci} (n={s['n']})"


def _interval(r: Mapping[str, Any], reference: bool) -> str:
    if reference:
        lo, hi = r.get("bounds") or (None, None)
        return f"allowed [{_x(lo)}, {'∞' if hi is None else _x(hi)}]"
    if r["ci_low"] is None:
        return "–"
    return f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]"


@dataclass(frozen=True)
class ShownCell:
    """A cell of a comparison as the table, the page and the report show it: every figure
    formatted."""

    label: str
    verdict: str
    base: str
    new: str
    ratio: str
    interval: str  # its 95 % CI, or a reference's allowed bounds
    accuracy: str
    memory: str
    reason: str
    notes: list[str]
    cost: str
    cost_verdict: str | None  # None: no prices given
    cost_reason: str


def rows(result: Comparison) -> list[ShownCell]:
    """One row of formatted strings per cell, slower cells first."""
    order = {"slower": 0, "faster": 1, "not comparable": 2, "same": 3}
    ordered = sorted(result.cells, key=lambda r: order[r["verdict"]])
    return [shown(r, result.reference) for r in ordered]


def shown(r: Mapping[str, Any], reference: bool) -> ShownCell:
    """A cell's row of the comparison (`verdicts.compare_cell`'s) formatted."""
    mem = _signed_pct(r["memory_change"])
    if r["memory"] and r["memory_change"] is not None:
        mem += f" ({r['memory']})"
    cost = "–"
    if r.get("cost_ratio") is not None:
        cost = f"{_x(r['cost_ratio'])} [{r['cost_ci_low']:.3g}, {r['cost_ci_high']:.3g}]"
    return ShownCell(
        label=r["label"],
        verdict=r["verdict"],
        base=_side(r["base"], reference),
        new=_side(r["new"], False),
        ratio=_x(r["ratio"]),
        interval=_interval(r, reference),
        accuracy=_points(r["accuracy_change"]),
        memory=mem,
        reason=r["reason"],
        notes=r["notes"],
        cost=cost,
        cost_verdict=r.get("cost_verdict"),
        cost_reason=r.get("cost_reason", ""),
    )


def headline(result: Comparison) -> str:
    c = result.counts
    parts = [f"{c[v]} {v}" for v in ("slower", "faster", "same", "not comparable") if c[v]]
    line = f"{len(result.cells)} cells: " + (", ".join(parts) or "none")
    if result.currency:  # prices given: the cost verdicts too
        costs = [r.get("cost_verdict") for r in result.cells]
        said = [f"{costs.count(v)} {v}" for v in ("dearer", "cheaper") if costs.count(v)]
        line += f"; cost ({result.currency}): " + (", ".join(said) or "no change")
    if result.reference:
        line += f"; {len(result.out_of_bounds)} outside their reference bounds"
    return f"{line}; exit status {result.exit_status}"


def text(result: Comparison) -> str:
    """The stdout table: verdict, ratio, CI, both sides, accuracy and memory change, cell."""
    b, n = result.base, result.new
    ref = result.reference
    lines = [
        f"trainscale.compare: {'REFERENCE' if ref else 'BASE'} {b['source']} "
        f"(study {b['study']!r}) vs {'STUDY' if ref else 'NEW'} {n['source']} "
        f"(study {n['study']!r}, {n['runs']} runs)",
    ]
    if not ref:
        ci = CI_NAMES.get(result.ci, result.ci)
        lines[0] += f"; threshold {100 * result.threshold:g} %, CI from {ci}"
    head = (
        f"{'verdict':<15}{'NEW/BASE' if not ref else 'STUDY/REF':>9}  "
        f"{'95% CI' if not ref else 'bounds':<24}"
        f"{'BASE samples/s' if not ref else 'reference':<24}"
        f"{'NEW samples/s' if not ref else 'STUDY samples/s':<24}"
        f"{'Δ acc':>10}{'Δ peak mem':>20}  cell"
    )
    lines += ["", head]
    for r in rows(result):
        lines.append(
            f"{r.verdict:<15}{r.ratio:>9}  {r.interval:<24}{r.base:<24}{r.new:<24}"
            f"{r.accuracy:>10}{r.memory:>20}  {r.label}"
        )
        if r.cost_verdict:  # prices given
            what = r.cost if r.cost != "–" else r.cost_reason
            lines.append(f"{'':<15}  cost per million NEW/BASE: {r.cost_verdict}, {what}")
        for note in ([r.reason] if r.reason else []) + r.notes:
            lines.append(f"{'':<15}  {note}")
    if result.environment:
        lines += ["", "environment and config differences (BASE -> NEW):"]
        for e in result.environment:
            lines.append(f"  {e['key']}: {e['base']} -> {e['new']}")
    elif not ref:
        lines += ["", "environment and config: no differences"]
    lines += ["", headline(result)]
    if result.slower:
        lines.append("slower: " + "; ".join(result.slower))
    if result.dearer:
        lines.append("dearer: " + "; ".join(result.dearer))
    if ref and result.out_of_bounds:
        lines.append("outside bounds: " + "; ".join(result.out_of_bounds))
    return "\n".join(lines) + "\n"


def write_json(result: Comparison, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    return path


def section(result: Comparison | None, error: str | None = None) -> dict | None:
    """What the study report's "Compared with …" section shows (None: no compare_with)."""
    if result is None and error is None:
        return None
    if error is not None:
        return {"error": error, "base": None, "rows": [], "environment": [], "headline": ""}
    return {
        "error": None,
        "base": result.base,
        "rows": rows(result),
        "environment": result.environment,
        "headline": headline(result),
        "threshold": result.threshold,
        "ci": CI_NAMES.get(result.ci, result.ci),
        "reference": result.reference,
        "currency": result.currency,
    }


def render_html(result: Comparison) -> str:
    env = templates()
    from trainscale.compare import references
    from trainscale.compare import verdicts as compare
    from trainscale.report import html as report

    doc = references.__doc__ if result.reference else compare.__doc__
    return env.get_template(PAGE).render(
        style=stylesheet(),
        compared=section(result),
        result=result,
        definitions=report.definitions(doc)[1],
    )


def write_html(result: Comparison, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result), encoding="utf-8")
    return path

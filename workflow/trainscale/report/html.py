"""The study report: one self-contained HTML file (figures embedded) from a study's tables.

The rule `report_html` writes it from the study's tables; `trainscale report` makes the whole
report from metrics files alone (trainscale.report.pipeline), e.g. files copied back from a
cluster, without Snakemake and without re-running any training:

    trainscale report --runs-dir results/<study>/runs --out results/<study>

Every file is validated against the metrics schema; files that fail are listed in the report and
in summary.txt, never counted, and never stop the rest.
"""

from __future__ import annotations

import base64
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

import trainscale
from trainscale.analysis import predict
from trainscale.analysis.aggregate import Study
from trainscale.report import classes as report_classes
from trainscale.report import cost_rows, rows
from trainscale.report.methods import methods_html
from trainscale.report.rows import mib, pct, ratio, with_ci

if TYPE_CHECKING:  # trainscale.report.figures imports matplotlib: only where figures are planned
    from trainscale.report.figures import Drawn

__all__ = [
    "caption_html",
    "context",
    "definitions",
    "mib",
    "pct",
    "ratio",
    "render_html",
    "tables_context",
    "with_ci",
]

REPORTS = Path(__file__).resolve().parents[3] / "reports"
TEMPLATE = "report.html.j2"


# --------------------------------------------------------------------------------------------
# definitions from a docstring whose bullets read `- term: text` (the tune and compare pages)


def definitions(doc: str) -> tuple[str, list[tuple[str, list[tuple[str, bool]]]]]:
    """(intro, [(term, text)]) from a docstring whose bullets read `- term: text`; the term ends
    at the first colon outside parentheses, and text is [(segment, is_code)] split at backticks.
    """
    intro, items, current = [], [], None
    for line in textwrap.dedent(doc).splitlines():
        if line.startswith("- "):
            split = _term_end(line)
            if split is None:  # a bullet without a term
                current = ["", line[2:].strip()]
            else:
                current = [line[2:split].strip(), line[split + 1 :].strip()]
            items.append(current)
        elif current is not None and line.startswith("  ") and line.strip():
            current[1] += " " + line.strip()
        elif line.strip():
            current = None
            if not items:
                intro.append(line.strip())
    return " ".join(intro), [(term, _code_segments(text)) for term, text in items]


def _term_end(line: str) -> int | None:
    depth = 0
    for i, ch in enumerate(line):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == ":" and depth == 0:
            return i
    return None


def _code_segments(text: str) -> list[tuple[str, bool]]:
    """`a `b` c` -> [("a ", False), ("b", True), (" c", False)]."""
    return [(seg, i % 2 == 1) for i, seg in enumerate(text.split("`")) if seg]


def caption_html(name: str) -> Markup:
    """A figure's caption (reports/figures/<name>.rst, which Snakemake's report renders too) as
    HTML: the two reST forms captions use, ``code`` and `text <#anchor>`_, rendered, not shown."""
    path = REPORTS / "figures" / f"{name}.rst"
    if not path.exists():
        return Markup("")
    text = str(escape(" ".join(path.read_text().split())))
    text = re.sub(r"``(.+?)``", r"<code>\1</code>", text)
    text = re.sub(r"`([^`]+?) &lt;(#[\w-]+)&gt;`_", r'<a href="\2">\1</a>', text)
    return Markup(text)


def _embed(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def left_out(drawn: dict[str, Drawn]) -> list[str]:
    """What the Figures section leaves out and why, one phrase per figure (the single line
    under its heading): figures with nothing to show, and the panels of the others that have
    one value on their axis (`trainscale.report.figures.registry.shown` decides both)."""
    from trainscale.report.figures import FIGURES

    out = []
    for name, info in FIGURES.items():
        d = drawn[name]
        if d.note is not None:
            why = d.note.split(": ", 1)[1] if ": " in d.note else d.note
            out.append(f"{info['title']} ({why})")
        elif d.left_out:
            out.append(f"from {info['title']}, {d.left_out}")
    return out


def figure_entries(
    figures_dir: Path | None, drawn: dict[str, Drawn], rank_by: str = "throughput"
) -> list[dict]:
    """Every figure of figures.yaml that has something to show, with its PNG images embedded
    (PNG only: SVG files, when config `report.svg` writes them, stay beside the report), or
    the note saying why a file is missing; figures with nothing to show are in `left_out`.
    The ranking's title follows config `report.rank_by`."""
    from trainscale.report.figures import FIGURES
    from trainscale.report.figures.ranking import RANKED_BY_COST

    out = []
    for name, info in FIGURES.items():
        d = drawn[name]
        if d.note is not None:
            continue
        entry = {
            "name": name,
            "title": RANKED_BY_COST if name == "ranking" and rank_by == "cost" else info["title"],
            "category": info["category"],
            "caption": caption_html(name),
            "note": None,
            "images": [],
        }
        for stem, selection in d.images:
            png = figures_dir / f"{stem}.png" if figures_dir else None
            if png is None or not png.exists():
                entry["note"] = f"figure file {stem}.png is missing"
                entry["images"] = []
                break
            entry["images"].append({"src": _embed(png), "selection": selection})
        out.append(entry)
    return out


def context(
    study: Study,
    figures_dir: str | Path | None,
    drawn: dict[str, Drawn],
    config: dict | None = None,
    compared: dict | None = None,
    predicted: dict | None = None,
    tables: dict | None = None,
) -> dict:
    """Everything the template shows, already formatted; `drawn` is what each figure became
    (`trainscale.report.figures.render_all` or `plan`); `compared` is the "Compared with …" section
    (trainscale.compare.output.section), None when the study sets no compare_with; `predicted`
    is the "Predicted scaling" section (trainscale.report.predict_plot.section), None when
    predictions are off; `tables` is `tables_context(study, config)` where already made."""
    return {
        **(tables if tables is not None else tables_context(study, config)),
        "figures": figure_entries(Path(figures_dir) if figures_dir else None, drawn, study.rank_by),
        "left_out": left_out(drawn),
        "predicted": predicted,
        "compared": compared,
    }


def tables_context(study: Study, config: dict | None = None) -> dict:
    """The part of `context` made from the tables alone (no figure, prediction or comparison):
    `python -m trainscale.report` makes it while the figures are drawn."""
    runs = study.runs
    counts = runs["status"].value_counts().to_dict() if len(runs) else {}
    over = int(runs["oversubscribed"].astype(bool).sum()) if len(runs) else 0
    scaling = rows.scaling_rows(study)
    communication = rows.communication_rows(study)
    n_failed = sum(n for status, n in counts.items() if status != "ok")
    return {
        "study": study.name,
        "version": trainscale.__version__,
        "n_runs": len(runs),
        "n_cells": len(study.scaling),
        "statuses": sorted(counts.items()),
        "n_invalid": len(study.invalid),
        "n_oversubscribed": over,
        "n_input_bound": sum(r["input_bound"] for r in scaling),
        "summary": rows.summary_rows(study),
        "models": rows.model_rows(study),
        "missing": sorted({r["note"] for r in scaling if r["note"]}),
        "scaling": scaling[: rows.MAX_CELLS],
        "scaling_more": max(0, len(scaling) - rows.MAX_CELLS),
        "communication": communication[: rows.MAX_CELLS],
        "communication_more": max(0, len(communication) - rows.MAX_CELLS),
        **report_classes.context(study),  # per_class, resources
        "cost": cost_rows.context(study),
        "n_collectives": rows.n_measured_collectives(study),
        "failed_collectives": rows.failed_collective_rows(study),
        "failed": rows.failed_rows(study),
        "failed_parts": rows.failed_part_rows(study),
        "failed_more": max(0, n_failed - rows.MAX_RUNS),
        "not_predicted": predict.not_covered(runs),
        "invalid": study.invalid[: rows.MAX_RUNS],
        "invalid_more": max(0, len(study.invalid) - rows.MAX_RUNS),
        "environment": rows.environment(study),
        "config": yaml.safe_dump(config, sort_keys=False, allow_unicode=True) if config else None,
        "spec_values": rows.spec_values(study) if len(runs) else "",
        "methods": methods_html(),
    }


def templates() -> Environment:
    """The jinja2 environment of every page trainscale writes (reports/*.j2): autoescaped,
    strict about missing values."""
    return Environment(
        loader=FileSystemLoader(REPORTS),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_html(ctx: dict) -> str:
    return templates().get_template(TEMPLATE).render(**ctx)


def stylesheet() -> str:
    """The study report's stylesheet, read from its template, for the other pages trainscale
    writes (a comparison, a tune): the pages never drift apart."""
    page = (REPORTS / TEMPLATE).read_text()
    found = re.search(r"<style>(.*?)</style>", page, re.S)
    return found.group(1) if found else ""


def write_html(
    study: Study,
    out: str | Path,
    figures_dir: str | Path | None,
    config: dict | None = None,
    drawn: dict[str, Drawn] | None = None,
    compared: dict | None = None,
    predicted: dict | None = None,
    tables: dict | None = None,
) -> Path:
    """report.html for `study`, embedding figures_dir/<image>.png; `drawn` (what each figure
    became) is planned again from the tables and config `report.highlight` when not given;
    `tables` as `context` takes it."""
    if drawn is None:
        from trainscale.report.figures import FIGURES, plan

        highlight = options(config)[1]
        drawn = {name: plan(name, study, highlight)[0] for name in FIGURES}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = context(
        study, figures_dir, drawn, config, compared=compared, predicted=predicted, tables=tables
    )
    out.write_text(render_html(ctx), encoding="utf-8")
    return out


def options(config: dict | None) -> tuple[bool, list[str]]:
    """(report.svg, report.highlight) of a study config (defaults: no SVG, no highlight)."""
    section = (config or {}).get("report") or {}
    return bool(section.get("svg", False)), list(section.get("highlight") or [])

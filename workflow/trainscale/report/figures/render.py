"""Drawing a study's figures into files: PNG always (what report.html embeds and `snakemake
--report` shows), SVG as well when config `report.svg` is true.

A figure with nothing to show (no data, or no facet whose axis has two values: the registry's
`shown` decides) is left out of report.html, which lists it in one line with the reason; its file
is still written, for `snakemake --report`, as a small image that says "no data in this study
for <figure>: <why>", never as an empty plot. A figure with more facets or lines than fit is
drawn as the parts `trainscale.report.figures.select` chooses; `Drawn` says which files and why.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from trainscale.analysis.aggregate import Study
from trainscale.report.figures import select
from trainscale.report.figures.registry import FIGURES, REGISTRY, shown
from trainscale.report.figures.style import theme

#: 96 dpi: a 3.2-inch facet is 307 pixels wide, sharp on screen and in report.html; each
#: pixel is drawn and compressed, so a higher resolution costs time at every report.
PNG_DPI = 96
#: zlib level of the PNG files: 1 is several times faster than matplotlib's default 6 and the
#: files (embedded in report.html) only about a tenth larger.
PNG_COMPRESS = 1


@dataclass(frozen=True)
class Drawn:
    """What figure `name` became: `note` says why nothing was drawn (None when drawn);
    `images` are its files' stems (name, or name--model when split) with the caption's
    sentence on what each one shows (None: the whole study); `left_out` says which of its
    panels were not drawn and why (None: none)."""

    note: str | None
    images: tuple[tuple[str, str | None], ...]
    left_out: str | None = None


def why_absent(name: str, study: Study) -> str | None:
    """Why the study has nothing to show in figure `name`, or None when it has."""
    d, _ = shown(REGISTRY[name], study)
    return d if isinstance(d, str) else None


def plan(
    name: str, study: Study, highlight: Sequence[str] = (), speed: pd.Series | None = None
) -> tuple[Drawn, list[select.Part]]:
    """What figure `name` will be for `study`, without drawing it (report.html reads this)."""
    kind = REGISTRY[name]
    d, left_out = shown(kind, study)
    if isinstance(d, str):
        note = f"no data in this study for {FIGURES[name]['title'].lower()}: {d}"
        return Drawn(note, ((name, None),)), []
    speed = select.speeds(study) if speed is None else speed
    parts = select.parts(d, kind, speed, highlight)
    images = tuple((p.stem, " ".join(filter(None, (p.note, _sentence(left_out))))) for p in parts)
    return Drawn(None, tuple((s, n or None) for s, n in images), left_out), parts


def _sentence(text: str | None) -> str | None:
    return f"{text[0].upper()}{text[1:]}." if text else None


def note_figure(text: str) -> Figure:
    """A small image that says what is missing (written instead of an empty plot)."""
    lines = textwrap.wrap(text, 90)
    fig = Figure(figsize=(7.0, 0.45 + 0.22 * len(lines)))
    fig.text(0.02, 0.5, "\n".join(lines), ha="left", va="center", fontsize=10, color="0.25")
    return fig


def save(fig: Figure, out: Path, stem: str, svg: bool) -> None:
    """out/<stem>.png, and out/<stem>.svg when `svg`."""
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(
        out / f"{stem}.png",
        format="png",
        dpi=PNG_DPI,
        metadata={"Software": None},
        pil_kwargs={"compress_level": PNG_COMPRESS},
    )
    if svg:
        fig.savefig(out / f"{stem}.svg", format="svg", metadata={"Date": None})


def render(
    name: str,
    study: Study,
    out: str | Path,
    *,
    svg: bool = False,
    highlight: Sequence[str] = (),
    speed: pd.Series | None = None,
) -> Drawn:
    """Draw figure `name` into out/<stem>.png (and .svg) for each of its images."""
    out = Path(out)
    with mpl.rc_context(theme()):
        drawn, parts = plan(name, study, highlight, speed)
        if drawn.note is not None:
            save(note_figure(drawn.note), out, name, svg)
        kind = REGISTRY[name]
        for part in parts:
            drawn_as = replace(part.kind or kind, title=part.title)
            save(kind.draw(part.data, drawn_as), out, part.stem, svg)
    return drawn


def render_all(
    study: Study,
    out: str | Path,
    names: Sequence[str] | None = None,
    *,
    jobs: int = 1,
    svg: bool = False,
    highlight: Sequence[str] = (),
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, Drawn]:
    """Every figure into out/; {name: Drawn}. Uses `jobs` processes; `meanwhile` (e.g.
    writing the CSV files) runs in this process while they draw."""
    names = list(names or FIGURES)
    out = Path(out)
    speed = select.speeds(study)
    jobs = max(1, min(jobs, len(names)))
    if jobs == 1:
        if meanwhile:
            meanwhile()
        return {n: render(n, study, out, svg=svg, highlight=highlight, speed=speed) for n in names}
    from concurrent.futures import ProcessPoolExecutor

    from trainscale.analysis.metrics_tables import mp_context

    study.convergence, study.ranking  # noqa: B018 (computed once, before forking)
    global _FORKED
    _FORKED = (study, speed)
    # heaviest first, so the processes finish together (at 10,000 runs the ranking took half
    # the figures' CPU time: 4.9 s of 9.4, a label and a note per cell)
    order = sorted(names, key=lambda n: n not in HEAVIEST)
    with ProcessPoolExecutor(jobs, mp_context=mp_context()) as ex:
        futures = [ex.submit(_render_forked, n, str(out), svg, tuple(highlight)) for n in order]
        if meanwhile:
            meanwhile()
        drawn = {n: f.result() for n, f in zip(order, futures, strict=True)}
    _FORKED = None
    return {n: drawn[n] for n in names}


#: the figures that take longest to draw in a large study, drawn first
HEAVIEST = ("ranking", "efficiency_heatmap", "warmup", "accuracy", "convergence")
_FORKED: tuple[Study, pd.Series] | None = None


def _render_forked(name: str, out: str, svg: bool, highlight: tuple[str, ...]) -> Drawn:
    assert _FORKED is not None, "render_all forks with the study set"
    study, speed = _FORKED
    return render(name, study, out, svg=svg, highlight=highlight, speed=speed)

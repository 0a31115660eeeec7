"""Colours, labels and the matplotlib theme of every figure: one table each, so a strategy has
the same colour in every figure and study.

The values are seaborn's (the "whitegrid" style, the "paper" context, the "colorblind",
"dark" and "muted" palettes, the "mako" colour map), written out here: importing seaborn
imports scipy.stats, two seconds of every report's start-up for a few constant tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from matplotlib.colors import LinearSegmentedColormap, to_rgb
from matplotlib.lines import Line2D

from trainscale.plan import catalog

COLORBLIND = "#0173b2 #de8f05 #029e73 #d55e00 #cc78bc #ca9161 #fbafe4 #949494 #ece133 #56b4e9"
DARK = "#001c7f #b1400d #12711c #8c0800 #591e71 #592f0d #a23582 #3c3c3c #b8850a #006374"
MUTED = "#4878d0 #ee854a #6acc64 #d65f5f #956cb4 #8c613c #dc7ec0 #797979 #d5bb67 #82c6e2"
#: seaborn's "mako", sampled at 11 points (efficiency heat maps).
MAKO = LinearSegmentedColormap.from_list(
    "mako",
    [
        "#0b0405",
        "#251729",
        "#382a54",
        "#413f80",
        "#395d9c",
        "#357ba3",
        "#3497a9",
        "#3eb4ad",
        "#60ceac",
        "#a9e1bd",
        "#def5e5",
    ],
)

#: One colour per strategy, the same in every figure and study (the catalog's rows).
STRATEGY_COLOURS: dict[str, tuple[float, float, float]] = catalog.strategy_colours()

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
DASHES = ["-", "--", "-.", ":"]


def theme() -> dict:
    """matplotlib rc of every figure: seaborn's whitegrid style in its paper context."""
    grey = ".15"
    return {
        "figure.facecolor": "white",
        "axes.facecolor": "white",
        "axes.edgecolor": ".8",
        "axes.grid": True,
        "axes.axisbelow": True,
        "axes.labelcolor": grey,
        "axes.linewidth": 1.0,
        "axes.labelsize": 9.6,
        "grid.color": ".8",
        "grid.linestyle": "-",
        "grid.linewidth": 0.8,
        "text.color": grey,
        "xtick.color": grey,
        "ytick.color": grey,
        "xtick.direction": "out",
        "ytick.direction": "out",
        "xtick.bottom": False,
        "ytick.left": False,
        "xtick.labelsize": 8.8,
        "ytick.labelsize": 8.8,
        "font.family": ["sans-serif"],
        "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "sans-serif"],
        "font.size": 9.6,
        "lines.linewidth": 1.2,
        "lines.markersize": 4.8,
        "lines.solid_capstyle": "round",
        "patch.edgecolor": "w",
        "patch.force_edgecolor": True,
        "svg.fonttype": "none",
        # A fixed title position: with the default (None) matplotlib measures every axes'
        # tick labels on each draw to lift titles over them; ours have none above the axes,
        # and the measuring was a fifth of the drawing time.
        "axes.titley": 1.0,
        "axes.titlepad": 4.0,
        # Glyphs as drawn, without the font's hinting program: matplotlib 3.11 renders each
        # glyph of each text on its own, and hinting was a fifth of the text-heavy ranking's
        # drawing time; at 96 dpi the letters are as legible (spaced a little more evenly).
        "text.hinting": "no_hinting",
        "svg.hashsalt": "trainscale",
        "axes.titlesize": 9,
        "legend.fontsize": 8,
        "legend.title_fontsize": 8,
    }


def relative_luminance(colour) -> float:
    """WCAG relative luminance of an RGB(A) colour (dark or light text on a heat-map cell)."""
    rgb = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in colour[:3]]
    return 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]


def sequential(n: int) -> list:
    """n colours of viridis, evenly inside its ends as seaborn picks them (N, scale)."""
    from matplotlib import colormaps

    return [colormaps["viridis"]((i + 1) / (max(n, 1) + 1)) for i in range(max(n, 1))]


# --------------------------------------------------------------------------------------------
# labels


def label(key: str, value) -> str:
    if key == "world_size":
        return f"N={value}"
    if key == "scale":
        return f"scale {value}"
    if key == "batch_size":
        return f"batch {value}"
    if key == "batch_mode":
        return "per-worker batch" if value == "per_worker" else "global batch"
    if key == "nodes":
        return f"{value} node" + ("s" if value != 1 else "")
    if key == "family":
        return f"{value} family"
    if key == "activation_checkpointing":
        return "no checkpointing" if value == "none" else f"{value} checkpointing"
    if key == "offload":
        return "no offload" if value == "none" else f"offload {value}"
    return str(value)


def labels(df: pd.DataFrame, keys: Sequence[str], only_varying: bool = False) -> pd.Series:
    """One label per row from `keys` (only those that vary in `df` if `only_varying`)."""
    keys = [k for k in keys if not only_varying or df[k].nunique(dropna=False) > 1]
    if not keys:
        return pd.Series("", index=df.index)
    parts = [df[k].map(lambda v, k=k: label(k, v)) for k in keys]
    out = parts[0]
    for p in parts[1:]:
        out = out + " · " + p
    return out


def hue_title(key: str) -> str:
    return {"world_size": "workers N", "scale": "dataset scale"}.get(key, key.replace("_", " "))


def palette(values: pd.Series, key: str) -> dict:
    levels = sorted(values.dropna().unique())
    if key == "strategy":
        spare = iter([to_rgb(c) for c in MUTED.split()] * (1 + len(levels) // 10))
        return {v: STRATEGY_COLOURS.get(v) or next(spare) for v in levels}
    return dict(zip(levels, sequential(len(levels)), strict=False))


def header(text: str) -> Line2D:
    """A legend row without a handle: the title of the rows below it."""
    return Line2D([], [], linestyle="none", marker="none", label=text)

"""The "Predicted scaling" figure and the report's summary of predictions.csv and
prediction_check.csv: measured throughput solid, predictions dashed with their bands, one panel
per strategy; and per family the efficiency knee and the range the model was checked on."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from trainscale.analysis.predict import FAMILY

NAME = "predicted_scaling"


def _label(key: dict, strategies: int) -> str:
    parts = [f"{key['model']}/{key['dataset']}", f"batch {key['batch_size']} {key['batch_mode']}"]
    if str(key["scale"]) not in ("1", "1.0"):
        parts.append(f"scale {key['scale']}")
    if key["precision"] != "fp32":
        parts.append(key["precision"])
    return ", ".join(parts)


#: Families drawn per panel at most (the fastest, by their best measured throughput): more
#: lines than this are unreadable, and each legend entry costs drawing time at every report.
MAX_LINES = 8
#: Inches of one panel, and around the panels (fixed: a layout engine would cost more than the
#: drawing).
PANEL_W, PANEL_H, LEFT, RIGHT, TOP, BOTTOM, WSPACE, HSPACE = 4.6, 3.2, 0.8, 0.2, 0.4, 0.5, 0.8, 0.8


def fastest_families(sub: pd.DataFrame) -> list[tuple]:
    """The family keys of one strategy's rows, fastest first (best measured throughput; those
    never measured last), at most MAX_LINES."""
    measured = sub[sub["basis"] == "measured"]
    best = measured.groupby(FAMILY, sort=False, dropna=False)["throughput_pred"].max()
    keys = list(sub.groupby(FAMILY, sort=True, dropna=False).groups)
    keys.sort(key=lambda k: -best.get(k, -1.0))
    return keys[:MAX_LINES]


def draw(pred: pd.DataFrame, out_dir: str | Path, svg: bool = False) -> list[Path]:
    """<out_dir>/predicted_scaling.png (and .svg with config `report.svg`); a figure that says
    so when there is nothing. A Figure object, no pyplot: importing pyplot costs more than
    drawing this figure."""
    from matplotlib.figure import Figure

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    strategies = sorted(pred["strategy"].unique()) if len(pred) else []
    cols = max(1, min(3, len(strategies)))
    rows = max(1, -(-len(strategies) // cols))
    width = LEFT + cols * PANEL_W + (cols - 1) * WSPACE + RIGHT
    height = TOP + rows * PANEL_H + (rows - 1) * HSPACE + BOTTOM
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(rows, cols, squeeze=False)
    fig.subplots_adjust(
        left=LEFT / width,
        right=1 - RIGHT / width,
        top=1 - TOP / height,
        bottom=BOTTOM / height,
        wspace=WSPACE / PANEL_W,
        hspace=HSPACE / PANEL_H,
    )
    for ax in axes.flat[len(strategies) :]:
        ax.set_visible(False)
    if not strategies:
        axes[0, 0].set_visible(True)
        axes[0, 0].text(0.5, 0.5, "no prediction (no data-parallel run)", ha="center")
        axes[0, 0].set_axis_off()
    for ax, strategy in zip(axes.flat, strategies, strict=False):
        sub = pred[pred["strategy"] == strategy]
        families = dict(list(sub.groupby(FAMILY, sort=True, dropna=False)))
        shown = fastest_families(sub)
        for i, key in enumerate(shown):
            fam = families[key].sort_values("world_size")
            color = f"C{i % 10}"
            label = _label(dict(zip(FAMILY, key, strict=True)), len(strategies))
            m = fam[fam["basis"] == "measured"]
            y = m["throughput_pred"]
            err = [y - m["throughput_lo"], m["throughput_hi"] - y]
            ax.errorbar(m["world_size"], y, yerr=err, fmt="-o", color=color, capsize=3, label=label)
            p = fam[fam["basis"] == "predicted"]
            if len(p):
                # dashed from the largest measured point on, so the two read as one curve
                last = m[m["world_size"] < p["world_size"].min()].tail(1)
                line = pd.concat([last, p])
                ax.plot(line["world_size"], line["throughput_pred"], "--", color=color)
                ax.fill_between(
                    p["world_size"], p["throughput_lo"], p["throughput_hi"], color=color, alpha=0.2
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        more = len(families) - len(shown)
        ax.set_title(strategy + (f": the {len(shown)} fastest of {len(families)}" if more else ""))
        ax.set_xlabel("workers N")
        ax.set_ylabel("samples/s (all workers)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, title="solid measured, dashed predicted", title_fontsize=7)
    png = out_dir / f"{NAME}.png"
    fig.savefig(png, dpi=96, metadata={"Software": None}, pil_kwargs={"compress_level": 1})
    if not svg:
        return [png]
    fig.savefig(out_dir / f"{NAME}.svg", metadata={"Date": None})
    return [png, out_dir / f"{NAME}.svg"]


def knees(pred: pd.DataFrame, check: pd.DataFrame) -> list[dict]:
    """Per family: the smallest N below 80 % and below 50 % efficiency (measured or predicted),
    the world sizes measured, and the held-out check (world sizes, error, in band)."""
    out = []
    if not len(pred):
        return out
    checks = _by_family(check)
    for key, fam in pred.groupby(FAMILY, sort=True, dropna=False):
        fam = fam.sort_values("world_size")
        k = dict(zip(FAMILY, key, strict=True))

        def first_below(level: float, fam=fam) -> str:
            below = fam[fam["efficiency_pred"] < level]
            if not len(below):
                return f"none up to N = {int(fam['world_size'].max())}"
            r = below.iloc[0]
            return f"N = {int(r.world_size)} ({r.basis})"

        held = checks.get(tuple(str(k[c]) for c in FAMILY), check.iloc[:0])
        done = held[held["predicted"].notna()] if len(held) else held
        if len(done):
            checked = ", ".join(
                f"N = {int(r.world_size)} from N = {r.fitted_on}: error {r.error_pct:+.1f} %, "
                f"{'inside' if r.in_band else 'outside'} the band"
                for r in done.itertuples(index=False)
            )
        elif len(held):
            checked = "not made: " + "; ".join(str(n) for n in held["note"])
        else:
            checked = "not made: no measured world size above 1"
        measured = fam[fam["basis"] == "measured"]["world_size"].astype(int).tolist()
        out.append(
            {
                **k,
                "measured": ", ".join(map(str, measured)) or "–",
                "knee80": first_below(0.8),
                "knee50": first_below(0.5),
                "checked": checked,
            }
        )
    return out


def _by_family(check: pd.DataFrame) -> dict[tuple[str, ...], pd.DataFrame]:
    """The held-out checks by family, their keys as text (the two tables are read from CSV,
    where a key's type may differ): one grouping, not a mask over every check per family."""
    if not len(check):
        return {}
    keys = check[FAMILY].astype(str)
    return {
        tuple(key): check.loc[at]
        for key, at in keys.groupby(FAMILY, sort=False, dropna=False).groups.items()
    }


def section(predictions_csv: str | Path, check_csv: str | Path, png: str | Path) -> dict:
    """What the report's "Predicted scaling" section shows, already formatted."""
    import base64

    from trainscale.analysis.aggregate import human

    pred = pd.read_csv(predictions_csv)
    check = pd.read_csv(check_csv, dtype={"fitted_on": object, "note": object})
    done = check[check["predicted"].notna()]
    inside = int(done["in_band"].astype(str).str.lower().eq("true").sum())
    rows = [
        {
            "family": f"{r.strategy} · {r.model}/{r.dataset} · batch {r.batch_size} "
            f"{r.batch_mode} · {r.precision}",
            "n": int(r.world_size),
            "fitted_on": r.fitted_on,
            "measured": human(r.measured),
            "predicted": "–" if pd.isna(r.predicted) else human(r.predicted),
            "band": "–" if pd.isna(r.lo) else f"{human(r.lo)} – {human(r.hi)}",
            "error": "–" if pd.isna(r.error_pct) else f"{r.error_pct:+.1f} %",
            "in_band": "–" if pd.isna(r.predicted) else "yes" if str(r.in_band) == "True" else "no",
            "note": r.note if isinstance(r.note, str) else "",
        }
        for r in check.itertuples(index=False)
    ]
    src = None
    if Path(png).exists():
        src = "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")
    predicted = pred[pred["basis"] == "predicted"]
    return {
        "src": src,
        "world_sizes": ", ".join(map(str, sorted(predicted["world_size"].unique()))) or "–",
        "knees": knees(pred, check),
        "check": rows,
        "check_rate": f"{inside} of {len(done)}" if len(done) else "no check could be made",
        "assumptions": sorted(
            {a for s in predicted["assumptions"] for a in str(s).split("; ")}
            - {
                a
                for s in predicted["assumptions"]
                for a in str(s).split("; ")
                if " node(s) of " in a
            }
        ),
    }

"""Figures and the HTML report: every figure drawn or explained, a self-contained escaped report,
the `python -m trainscale.report` command line, headless Chromium, and the Snakemake rules
(including `snakemake --report`) on metrics files copied in from elsewhere."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from matplotlib.collections import LineCollection, PathCollection
from test_aggregate import failed_record, ok_record, spec_for, write
from test_collectives import fake_collectives

from trainscale.analysis import aggregate
from trainscale.analysis.study import Study
from trainscale.plan.matrix import build_runs
from trainscale.report import cli as report_cli
from trainscale.report import figures
from trainscale.report import html as report
from trainscale.report.methods import METHODS, anchor, methods_html

from conftest import ROOT, validated

PNG = b"\x89PNG\r\n\x1a\n"
#: The figures a study must have, held here and not read from reports/figures.yaml, so that a
#: figure dropped from the registry (and so from every loop over it) fails a test.
FIGURES = (
    "ranking",
    "throughput",
    "speedup",
    "efficiency",
    "mfu",
    "efficiency_heatmap",
    "epoch_time",
    "warmup",
    "data_wait",
    "throughput_scale",
    "throughput_batch",
    "accuracy",
    "convergence",
    "memory",
    "memory_predicted",
    "memory_trade",
    "cost_time",
    "busbw",
)
XSS = "<script>alert('x')</script> & <b>bold</b>"


def rich_study(runs: Path) -> list[Path]:
    """Every figure has data: 2 strategies, N = 1, 2, two batch sizes, scales and batch modes,
    2 repeats, an oversubscribed run, a failed run whose error holds HTML, an invalid file."""
    paths = []
    for strategy in ("torch", "torch-ddp"):
        for workers in (1, 2) if strategy == "torch-ddp" else (1,):
            for batch in (64, 128):
                for scale in (1, 2):
                    for mode in ("global", "per_worker"):
                        for r in range(2):
                            s = spec_for(
                                strategy,
                                workers,
                                repeat=r,
                                batch_size=batch,
                                scale=scale,
                                batch_mode=mode,
                            )
                            t = 0.5 * scale / workers**0.8 * (1 + 0.05 * r) * 64 / batch
                            rec = ok_record(
                                s,
                                [t, t * 1.02],
                                first=t * 1.5,
                                samples=1000 * scale,
                                oversubscribed=workers == 2 and r == 1,
                                data_wait=0.15 if workers == 2 else 0.02,  # N=2: input-bound
                            )
                            peak = 2**30 * batch // 64 // workers  # as if measured on a GPU
                            rec["memory"]["peak_device_bytes"] = peak
                            rec["memory"]["predicted"] = {"total_bytes": int(1.05 * peak),
                                                          "method": "traced"}  # fmt: skip
                            paths.append(write(runs, s, rec))
    for r in range(2):  # torch with full activation checkpointing: slower, half the memory
        s = dataclasses.replace(spec_for("torch", 1, repeat=r), activation_checkpointing="full")
        t = 0.5 * 1.25 * (1 + 0.05 * r)
        rec = ok_record(s, [t, t * 1.02], first=t * 1.5)
        rec["memory"]["peak_device_bytes"] = 2**29
        paths.append(write(runs, s, rec))
    for r in range(2):  # N = 4 in one configuration: the heat map has two N > 1 to show
        s = spec_for("torch-ddp", 4, repeat=r)
        t = 0.5 / 4**0.8 * (1 + 0.05 * r)
        paths.append(write(runs, s, ok_record(s, [t, t * 1.02], first=t * 1.5)))
    s = spec_for("torch-ddp", 2, repeat=2)
    paths.append(write(runs, s, failed_record(s, "failed", f"RuntimeError: {XSS}\nTraceback")))
    bad = runs / "strategy~torch" / "corrupt" / "metrics.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": "trainscale.metrics/1", "status": "ok"')
    for w in (2, 4):
        bench = runs.parent / "collectives" / "backend~gloo" / f"workers~{w}" / "nodes~1.json"
        fake_collectives(
            bench, {2**k: [1e-4 * k, 2e-4 * k, 3e-4 * k] for k in range(10, 14)}, workers=w
        )
    return paths


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Study]:
    """The whole report made by the command line from a directory of metrics files."""
    root = tmp_path_factory.mktemp("rich")
    rich_study(root / "runs")
    config = root / "config.yaml"  # prices, for the cost figure
    config.write_text("cost: {device_hour: {cpu-core: 0.04}}\n")
    args = ["--runs-dir", str(root / "runs"), "--out", str(root / "out"), "--jobs", "2"]
    rc = report_cli.main([*args, "--config", str(config)])
    assert rc == 0  # invalid files are listed, not fatal
    out = root / "out"
    study = Study.read(out)
    return out, study


# --------------------------------------------------------------------------------------------
# command line


def test_cli_writes_tables_figures_and_report(built):
    out, study = built
    for f in ("runs.csv", "epochs.csv", "scaling.csv", "invalid.csv", "summary.txt", "report.html"):
        assert (out / f).stat().st_size > 0, f
    # torch, ddp, torch with full checkpointing, N=4, failed
    assert len(study.runs) == 2 * 2 * 2 * 2 + 2 * 2 * 2 * 2 * 2 + 2 + 2 + 1
    assert len(study.scaling) == 8 + 16 + 1 + 1
    assert [Path(p).parent.name for p, _ in study.invalid] == ["corrupt"]
    summary = (out / "summary.txt").read_text()
    assert "invalid metrics files (not counted)" in summary and "corrupt" in summary
    assert "fastest strategy per model, dataset and N" in summary


def test_cli_help_documents_usage():
    p = subprocess.run(
        [sys.executable, "-m", "trainscale.report", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 0
    for needle in ("--runs-dir", "--out", "metrics schema", "report.html", "scaling.csv"):
        assert needle in p.stdout


def test_cli_exit_codes(tmp_path, capsys):
    assert report_cli.main(["--runs-dir", str(tmp_path / "nothing"), "--out", str(tmp_path)]) == 2
    assert "no metrics.json" in capsys.readouterr().err
    runs = tmp_path / "runs"
    s = spec_for("torch", 1)
    write(runs, s, ok_record(s, [1.0, 1.0]))
    (runs / "x").mkdir()
    (runs / "x" / "metrics.json").write_text("[]")
    args = ["--runs-dir", str(runs), "--out", str(tmp_path / "out"), "--jobs", "1"]
    assert report_cli.main([*args, "--strict"]) == 1
    assert (tmp_path / "out" / "report.html").exists()


# --------------------------------------------------------------------------------------------
# figures


def test_figure_kinds_are_listed_once():
    assert list(figures.REGISTRY) == list(figures.FIGURES)
    assert sorted(figures.FIGURES) == sorted(FIGURES)
    for name, kind in figures.REGISTRY.items():
        assert kind.name == name and callable(kind.data) and callable(kind.draw), name
    for name, info in figures.FIGURES.items():
        assert {"title", "category"} <= set(info), name
        assert (ROOT / "reports" / "figures" / f"{name}.rst").read_text().strip(), name
    smk = (ROOT / "workflow" / "rules" / "report.smk").read_text()
    assert "figures.yaml" in smk


def test_every_figure_is_drawn_for_a_rich_study(built):
    out, study = built
    notes = {name: figures.why_absent(name, study) for name in FIGURES}
    assert notes == dict.fromkeys(FIGURES), notes
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").read_bytes().startswith(PNG)
    # report.svg is false by default: PNG only
    assert not list((out / "figures").glob("*.svg"))


def test_every_line_fits_its_facet(built):
    """A row of facets shares its y axis: the range must hold every facet's data, including
    the facets drawn last (a limit fixed too early once cut the larger lines off)."""
    _, study = built
    for name in FIGURES:
        kind = figures.REGISTRY[name]
        d = kind.data(study)
        if name == "efficiency_heatmap":
            continue  # images, not lines
        fig = kind.draw(d, kind)
        for ax in fig.axes:
            lo, hi = sorted(ax.get_ylim())  # the ranking's y axis runs top down
            for ys in _data_ys(ax):
                ys = [y for y in ys if y == y]
                if ys:
                    assert lo <= min(ys) and max(ys) <= hi, (name, ax.get_title(), ys, hi)


def _data_ys(ax):
    """The y values of every line, line collection and marker collection drawn in data
    coordinates (reference lines in axes coordinates, e.g. axvline, are left out)."""
    for line in ax.get_lines():
        if line.get_transform() == ax.transData:
            yield list(line.get_ydata())
    for coll in ax.collections:
        if isinstance(coll, LineCollection) and coll.get_transform() == ax.transData:
            yield [y for seg in coll.get_segments() for y in seg[:, 1]]
        elif isinstance(coll, PathCollection) and coll.get_offset_transform() == ax.transData:
            yield list(coll.get_offsets()[:, 1])


def test_absent_data_gives_a_note_image_not_an_empty_plot(tmp_path):
    runs = tmp_path / "runs"
    paths = []
    for r in range(2):  # one strategy, N = 1 only, one batch size and scale
        s = spec_for("torch", 1, repeat=r)
        paths.append(write(runs, s, ok_record(s, [1.0, 1.0])))
    s = spec_for("torch-ddp", 2)  # a 2-worker cell whose N=1 baseline was never run
    paths.append(write(runs, s, ok_record(s, [0.6, 0.6])))
    study = Study.build(paths)
    drawn = figures.render_all(study, tmp_path / "figures", svg=True)
    notes = {n: d.note for n, d in drawn.items()}
    absent = {n for n, note in notes.items() if note}
    assert absent == {
        "ranking",  # one strategy at each N: nothing to rank
        "speedup",
        "efficiency",
        "efficiency_heatmap",
        "epoch_time",  # torch at N = 1 only, torch-ddp at N = 2 only
        "throughput_scale",
        "throughput_batch",
        "accuracy",
        "memory_predicted",
        "memory_trade",
        "cost_time",  # no prices
        "busbw",
    }
    assert "nothing was predicted" in notes["memory_predicted"]
    assert "varies neither activation_checkpointing nor offload" in notes["memory_trade"]
    assert "no N=1 run of torch-ddp" in notes["speedup"]
    assert "no all-reduce benchmark ran" in notes["busbw"]
    assert "no prices (config cost.device_hour)" in notes["cost_time"]
    assert notes["throughput_scale"].endswith("dataset scale was not varied: 1 only")
    assert notes["accuracy"].endswith("batch size was not varied: 64 only")
    assert "no panel has more than one workers N (1, 2 in different panels)" in notes["epoch_time"]
    assert "strategy" in notes["ranking"]
    for name in FIGURES:
        svg = (tmp_path / "figures" / f"{name}.svg").read_text()
        assert ET.fromstring(svg).tag.endswith("svg")  # report.svg: true writes SVG as well
        assert (tmp_path / "figures" / f"{name}.png").read_bytes().startswith(PNG)
        assert ("no data in this study" in svg) == (name in absent), name
    page = report.render_html(report.context(study, tmp_path / "figures", drawn))
    # left out of the page: one line lists them with their reasons, and no <figure> shows them
    line = re.search(r'<p class="left-out"[^>]*>(.*?)</p>', page, re.S).group(1)
    for name in absent:
        title, why = figures.FIGURES[name]["title"], notes[name].split(": ", 1)[1]
        assert html.escape(f"{title} ({why})") in line, name
        assert f'id="figure-{name}"' not in page
    assert len(re.findall(r'<figure id="figure-', page)) == len(FIGURES) - len(absent)
    nothing = Study.build([])
    assert all(figures.why_absent(n, nothing) for n in FIGURES)


def _cells(strategies: int, models: int, datasets: int = 1) -> pd.DataFrame:
    """A scaling table of made-up cells: strategy s{i} is faster the larger i is."""
    rows = [
        {"strategy": f"s{i:02d}", "model": f"m{m}", "dataset": f"d{d}", "world_size": n,
         "throughput_mean": 100.0 * (i + 1) * n}
        for i in range(strategies) for m in range(models) for d in range(datasets)
        for n in (1, 2)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_a_figure_over_12_facets_draws_the_fastest_strategies_and_the_highlighted():
    from trainscale.report.figures import select

    kind = figures.REGISTRY["epoch_time"]  # facets: model · dataset × strategy
    d = _cells(strategies=16, models=2)
    speed = d.groupby(["model", "dataset", "strategy"])["throughput_mean"].max()
    assert select.n_facets(d, kind) == 32
    parts = select.parts(d, kind, speed, highlight=["s00"])
    assert len(parts) == 1 and parts[0].stem == "epoch_time"
    assert select.n_facets(parts[0].data, kind) <= select.MAX_FACETS
    kept = sorted(parts[0].data["strategy"].unique())
    assert "s00" in kept and "s15" in kept  # the highlighted slow one and the fastest
    assert len(kept) == 4  # 2 rows × (the 3 fastest + s00) = 8 facets
    assert "the 3 fastest" in parts[0].note and "report.highlight (s00)" in parts[0].note
    small = _cells(strategies=3, models=2)
    assert select.parts(small, kind, speed)[0].note is None  # 6 facets: the whole study


def test_a_figure_over_12_facets_without_strategy_facets_is_split_per_model():
    from trainscale.report.figures import select

    kind = figures.REGISTRY["warmup"]  # facets: model · dataset × 3 kinds of epoch time
    d = _cells(strategies=2, models=3, datasets=2)
    d = pd.concat([d.assign(kind=k) for k in ("a", "b", "c")], ignore_index=True)
    parts = select.parts(d, kind, pd.Series(dtype=float))
    assert [p.stem for p in parts] == ["warmup", "warmup--m1", "warmup--m2"]
    for p, model in zip(parts, ("m0", "m1", "m2"), strict=True):
        assert set(p.data["model"]) == {model} and select.n_facets(p.data, kind) == 6
        assert f"one figure per model (3): this one {model}" in p.note and model in p.title


# --------------------------------------------------------------------------------------------
# the HTML report


def test_report_is_self_contained_escaped_and_complete(built):
    out, study = built
    page = (out / "report.html").read_text()
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert len(srcs) == len(FIGURES) + 1  # + the predicted-scaling figure
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG)
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", page)
    assert "Content-Security-Policy" in page and "<script" not in page.split("</head>")[1]
    assert "&lt;script&gt;alert(" in page and XSS not in page  # autoescaped error text
    for section in (
        "Summary",
        "Figures",
        "Scaling table",
        "Failed runs",
        "Environment",
        "Study config",
        "Methods",
    ):
        assert f">{section}" in page, section
    assert "oversubscribed" in page and "corrupt" in page
    # the N = 2 cells wait 15% of their epochs for data: flagged, and counted above the table
    assert ">input-bound</span>" in page and "cells input-bound</span>" in page
    assert set(study.scaling.loc[study.scaling["input_bound"], "world_size"]) == {2}
    # Methods is docs/methods.md rendered: every bold term, and no markup printed as written
    methods = page.split('<h2 id="methods">')[1]
    for term in re.findall(r"^- \*\*(.+?)\*\*:", METHODS.read_text(), re.M):
        shown = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(term, quote=False))
        assert f"<strong>{shown}</strong>" in methods, term
    assert "``" not in page and "**" not in methods and '<h3 id="methods-per-cell' in methods
    assert "includes warm-up" in page and "t1 / (N · tN)" in page and "X(N) / (N · X(1))" in page
    assert "torch-ddp with N = 1" in page
    # numbers for people: 3 significant digits and units
    assert re.search(r"\d,\d{3} ± [\d.,]+ samples/s", page)


def test_numbers_are_formatted_for_people():
    assert report.with_ci(12721.4, 338.2, "samples/s") == "12,700 ± 338 samples/s"
    assert report.with_ci(0.51338, float("nan"), "s") == "0.513 s"
    assert report.with_ci(None, None) == "–"
    assert report.mib(459522048) == "438 MiB" and report.mib(3 * 2**30) == "3.00 GiB"
    assert report.pct(0.4231) == "42.3 %" and report.ratio(1.1875) == "1.19×"


def test_methods_defines_every_figure_once_with_anchors():
    """docs/methods.md, as the report renders it: the terms the formulas are checked by, and an
    anchor per section and per term that captions link to."""
    text = " ".join(METHODS.read_text().split())
    assert "first_epoch_seconds**: epoch 1, which includes warm-up" in text
    assert "**speedup**: S(N) = X(N) / X(1)" in text
    assert "E = t1 / (N · tN)" in text and "E = X(N) / (N · X(1))" in text
    rendered = methods_html()
    ids = re.findall(r' id="([^"]+)"', rendered)
    assert len(ids) == len(set(ids)) and "<h1" not in rendered
    assert {"methods-ranking", "methods-comparison-with-the-best", "methods-speedup"} <= set(ids)
    assert anchor("Per cell (scaling.csv) and the summary") in ids
    # every caption renders its reST (no backticks shown) and links to an anchor that exists
    for name in [*FIGURES, "predicted_scaling"]:
        caption = str(report.caption_html(name))
        assert "`" not in caption, name
        assert set(re.findall(r'href="#([^"]+)"', caption)) <= set(ids), name
    assert 'href="#methods-ranking"' in report.caption_html("ranking")


# --------------------------------------------------------------------------------------------
# headless Chromium

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHECK = """<script>
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  const broken = imgs.filter((i) => !(i.complete && i.naturalWidth > 0)).length;
  console.log("trainscale-check images=" + imgs.length + " broken=" + broken);
});
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.skipif(
    chromium() is None,
    reason="needs Debian's `chromium` (apt-get install -y chromium) to render the report headless",
)
def test_report_renders_in_headless_chromium(built, tmp_path):
    out, _ = built
    page = (out / "report.html").read_text()
    # a copy that may run one inline script counting loaded images; the report itself has none
    checked = page.replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';")
    checked = checked.replace("</body>", CHECK + "</body>")
    (tmp_path / "checked.html").write_text(checked)
    p = run_chromium(
        tmp_path,
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        "--dump-dom",
        (tmp_path / "checked.html").as_uri(),
    )
    assert p.returncode == 0, p.stderr[-2000:]
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    assert any("trainscale-check" in line for line in console), p.stderr[-3000:]
    check = next(line for line in console if "trainscale-check" in line)
    assert f"images={len(FIGURES) + 1} broken=0" in check  # + the predicted-scaling figure
    errors = [line for line in console if "trainscale-check" not in line]
    assert errors == [], errors  # no CSP violations, failed loads or script errors
    # Methods and the captions as the browser built them: markup rendered, links in the page
    dom = p.stdout
    assert '<h3 id="methods-per-run-metricsjson">' in dom and "<strong>speedup</strong>" in dom
    assert 'href="#methods-ranking"' in dom and "``" not in dom and "**" not in dom
    shot = out / "report-screenshot.png"
    p = run_chromium(
        tmp_path,
        f"--screenshot={shot}",
        "--window-size=1280,2400",
        "--hide-scrollbars",
        (out / "report.html").as_uri(),
    )
    assert p.returncode == 0 and shot.exists(), p.stderr[-2000:]
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 2400)
    colours = img.resize((320, 600)).getcolors(maxcolors=1 << 16) or []
    assert len(colours) > 200  # text, tables and a figure, not a blank or error page
    white = max(n for n, c in colours if c == (255, 255, 255)) / (320 * 600)
    assert 0.3 < white < 0.97
    shutil.copy(shot, tmp_path / "screenshot.png")


# --------------------------------------------------------------------------------------------
# Snakemake: aggregation and report on metrics files gathered from elsewhere


SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


@pytest.mark.slow
def test_snakemake_reports_copied_results_without_training(tmp_path):
    cfg = validated(
        {
            "study": "copied",
            "epochs": 3,
            "repeats": 2,
            "target_accuracy": 0.6,
            "report": {"svg": True},
            "matrix": {
                "strategy": ["torch", "torch-ddp"],
                "model": ["seed-small"],
                "dataset": ["digits"],
                "batch_size": [64],
                "workers": [1, 2],
            },
        }
    )
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    runs, _ = build_runs(cfg, accelerator="cpu")
    results = tmp_path / "results" / "copied"
    for spec in runs:
        t = 0.5 / spec.world_size**0.7
        write(results / "runs", spec, ok_record(spec, [t, t], first=2 * t))
    broken = results / "runs" / runs[-1].path / "metrics.json"
    broken.write_text(json.dumps({"schema": "trainscale.metrics/1", "status": "weird"}))

    def snakemake(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                SNAKEMAKE,
                "-s",
                str(ROOT / "Snakefile"),
                "--directory",
                str(tmp_path),
                "--configfile",
                str(tmp_path / "cfg.yaml"),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )

    p = snakemake("--cores", "2", "--quiet", "host")  # the job blocks shown (docs/config.md)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]
    assert re.search(r"^\s*(local)?rule runs_table:", log, re.M), log[-4000:]
    assert not re.search(r"^\s*(local)?rule train:", log, re.M), "training must not re-run"
    page = (results / "report.html").read_text()
    assert html.escape(broken.relative_to(tmp_path).as_posix()) in page
    summary = (results / "summary.txt").read_text()
    assert "invalid metrics files (not counted)" in summary and runs[-1].path in summary
    assert (results / "scaling.csv").exists()
    # one batch size, one scale and one N > 1: these have nothing to show, and say so; every
    # other figure (busbw too: the workflow ran the all-reduce benchmark for N = 2) must be a
    # drawing, not the "no data" placeholder
    absent = {"throughput_scale", "throughput_batch", "accuracy", "efficiency_heatmap",
              "memory_predicted", "memory_trade", "cost_time"}  # fmt: skip
    for name in FIGURES:
        svg = (results / "figures" / f"{name}.svg").read_text()
        assert ("no data in this study" in svg) == (name in absent), name
    assert "study: copied" in page  # the study config as Snakemake ran it
    # snakemake --report: categories and labels for every figure, and the custom report
    p = snakemake("--report", str(results / "report.zip"))
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    with zipfile.ZipFile(results / "report.zip") as z:
        names = z.namelist()
        index = z.read(next(n for n in names if n.endswith("report/report.html"))).decode()
    assert any(n.endswith("/report.html") and "/data/raw/" in n for n in names)
    for name in FIGURES:
        info = figures.FIGURES[name]
        assert any(n.endswith(f"/{name}.png") for n in names), name  # --report takes PNG
        assert info["title"] in index and info["category"] in index
    assert '"strategy": "torch, torch-ddp"' in index and '"model": "seed-small"' in index


def test_report_shows_the_communication_model(built):
    """torch-ddp N=2 of the rich study beside its generated all-reduce benchmark: the predicted
    time per step in the page is the hand computation t = 2(N − 1)/N · S / B."""
    out, study = built
    page = (out / "report.html").read_text()
    assert 'id="communication"' in page and "Communication: predicted" in page
    comm = study.communication
    assert len(comm) and set(comm["strategy"]) == {"torch-ddp"}
    assert comm.loc[comm["world_size"] == 4, "predicted_comm_seconds"].notna().all()
    comm = comm[comm["world_size"] == 2]
    # S = 1000 params × 4 = 4000 B, between the 2048 B (t_p50 2.2 ms) and 4096 B (2.4 ms) sizes
    b2, b4 = 2048 / 2.2e-3, 4096 / 2.4e-3
    bw = b2 + (b4 - b2) * (math.log2(4000) - 11)
    assert comm["predicted_comm_seconds"].to_list() == pytest.approx([4000 / bw] * len(comm))
    assert f"{aggregate.human(4000 / bw * 1e3)} ms" in page
    assert "ring" in page and "no overlap" in page  # Methods states the assumptions
    assert "bus bandwidth" in page and "2(n − 1)/n" in page


def test_a_forked_part_of_the_report_gives_its_result_or_its_error():
    from trainscale.report.pipeline import forked

    assert forked(lambda: {"rows": [1, 2]})() == {"rows": [1, 2]}
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        forked(lambda: 1 / 0)()


def test_the_runs_columns_are_summarised_by_their_distinct_values():
    """The environment lines and the specs' values (report.html's "Environment" and, without a
    config, "Study config") count each distinct value once per run, split host lists into
    hosts, and keep 1 and 1.0 apart where a column mixes them; failed parts come by run."""
    from trainscale.analysis.summary import failed_parts
    from trainscale.report import rows

    runs = pd.DataFrame(
        {
            "run": ["b", "a", "c"],
            "env.hostnames": ["n1 n2", "n1", None],
            "spec.lr": pd.Series([1, 1.0, None], dtype=object),
            "spec.model": ["m", "m", "m"],
            "warnings": [json.dumps([{"part": "p", "error": "e"}]), None, "no list"],
        }
    )
    assert rows._values(runs["env.hostnames"], split=True) == "n1 (2 runs); n2 (1 run)"
    assert rows._values(runs["spec.model"]) == "m"
    assert rows._values(pd.Series([None, None], dtype=object)) == "–"
    assert yaml.safe_load(rows.spec_values(SimpleNamespace(runs=runs))) == {
        "lr": ["1", "1.0"],
        "model": "m",
    }
    assert failed_parts(runs) == [("b", "p", "e")]

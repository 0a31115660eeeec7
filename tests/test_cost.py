"""What a cell costs per million samples or tokens (trainscale.analysis.cost, config `cost`):
device-hours, money and energy from real records of `.test/config.yaml` (conftest.torch_study),
priced as a CPU study and, with their device renamed, as GPU runs; the report's Cost table,
cost-time figure and ranking by cost built from them. Pre-flight: tests/test_bad_input.py;
`trainscale compare --cost`: tests/test_compare.py."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from trainscale.analysis import cost
from trainscale.analysis.study import Study
from trainscale.plan.prices import Prices, check
from trainscale.plan.studyconfig import StudyConfig

from conftest import PYTHON, ROOT, run_env

CPU_PRICES = {"cost": {"device_hour": {"cpu-core": 0.04, "H100": 2.49}, "currency": "EUR"}}


def per_million(rec: dict) -> float:
    """Device-hours per million samples of one record, by the definition (digits: a sample is
    an image, so u = 1)."""
    return rec["spec"]["world_size"] * 1e6 / rec["throughput"] / 3600


def test_device_hours_and_cpu_cost_follow_their_definitions(torch_study):
    study = Study.build(torch_study["files"], config=CPU_PRICES)
    s = study.scaling.set_index(["strategy", "world_size"])
    for rec, _ in torch_study["recs"]:
        cell = s.loc[(rec["spec"]["strategy"], rec["spec"]["world_size"])]
        dh = per_million(rec)  # one repeat: the cell's mean is the run's figure
        assert cell["device_hours_per_million"] == pytest.approx(dh, rel=1e-9)
        assert cell["device_hours_per_million_mean"] == pytest.approx(dh, rel=1e-9)
        threads = rec["spec"]["threads_per_worker"]
        assert cell["cost_per_million"] == pytest.approx(dh * threads * 0.04, rel=1e-9)
        assert cell["price_key"] == "cpu-core" and cell["currency"] == "EUR"
        assert np.isnan(cell["kwh_per_million"])  # no RAPL counter readable here
    # without prices: device-hours still, no money
    bare = Study.build(torch_study["files"]).scaling
    assert bare["device_hours_per_million"].notna().all()
    assert bare["cost_per_million"].isna().all() and (bare["price_note"] == "").all()


def test_cis_over_repeats_and_energy_from_the_records(torch_study):
    """Two copies of each record with throughput ×1 and ×1.5 and a measured energy: each cost
    figure gets its Student-t CI over the two, and kWh per million is energy over the samples
    of every epoch."""
    recs = []
    for rec, _ in torch_study["recs"]:
        for repeat, factor in ((0, 1.0), (1, 1.5)):
            r = json.loads(json.dumps(rec))
            r["spec"]["repeat"], r["throughput"] = repeat, rec["throughput"] * factor
            r["device"]["energy_joules"] = 3.6e6 * factor  # 1 and 1.5 kWh
            recs.append(r)
    runs = pd.DataFrame(cost.run_costs(_runs(recs), Prices({"cpu-core": 1.0})))
    trained = [sum(e["samples"] for e in r["epochs"]) for r in recs]
    assert runs["kwh_per_million"].tolist() == pytest.approx(
        [r["device"]["energy_joules"] / 3.6e6 / n * 1e6 for r, n in zip(recs, trained, strict=True)]
    )
    study = Study(name="x", runs=_runs(recs), prices=Prices({"cpu-core": 1.0}))
    for cell in study.scaling.itertuples():
        dh = [per_million(r) for r in recs if r["spec"]["strategy"] == cell.strategy
              and r["spec"]["world_size"] == cell.world_size]  # fmt: skip
        half = 12.706204736 * np.std(dh, ddof=1) / np.sqrt(2)  # t(0.975, 1)
        assert cell.device_hours_per_million_ci95_repeats == pytest.approx(half, rel=1e-6)
        # from steps and repeats: the throughput's relative half-width (Methods)
        rel = cell.throughput_ci95 / cell.throughput_mean
        assert cell.device_hours_per_million_ci95 == pytest.approx(
            rel * cell.device_hours_per_million_mean, rel=1e-9
        )
        assert cell.kwh_per_million_n == 2 and cell.kwh_per_million_ci95 > 0


def _runs(recs: list[dict]) -> pd.DataFrame:
    """The runs table of records changed in memory, each named as the reader names a file."""
    from trainscale.analysis.metrics_tables import runs_frame

    for i, r in enumerate(recs):
        r["run"] = f"{r['spec']['strategy']}/{r['spec']['world_size']}/{i}"
    return runs_frame(recs)


def test_gpu_prices_match_one_key_by_name_and_the_rest_are_warned(torch_study):
    names = {"torch": "NVIDIA H100 80GB HBM3", "torch-ddp": "NVIDIA A10"}
    recs = []
    for rec, _ in torch_study["recs"]:
        r = json.loads(json.dumps(rec))
        r["device"].update(kind="cuda", name=names[r["spec"]["strategy"]])
        recs.append(r)
    priced = Study(name="x", runs=_runs(recs), prices=Prices({"h100": 2.0, "A100": 1.0}))
    s = priced.scaling.set_index("strategy")
    assert s.loc["torch", "price_key"] == "h100"  # case-insensitive: per GPU, no threads
    assert s.loc["torch", "cost_per_million"] == pytest.approx(
        2.0 * s.loc["torch", "device_hours_per_million"]
    )
    assert s.loc["torch-ddp", "cost_per_million"].isna().all()
    assert cost.price_warnings(priced.scaling) == [
        "no key of cost.device_hour matches the device 'NVIDIA A10'"
    ]
    assert "no key of cost.device_hour matches the device 'NVIDIA A10'" in priced.summary()
    both = Study(name="x", runs=_runs(recs), prices=Prices({"H100": 2.0, "80GB": 3.0}))
    (warning,) = [w for w in cost.price_warnings(both.scaling) if "H100" in w]
    assert warning == (
        "several keys of cost.device_hour match the device 'NVIDIA H100 80GB HBM3': '80GB', 'H100'"
    )


def test_the_longest_key_that_is_part_of_a_name_prices_it():
    """The key H100 is part of "NVIDIA H100 NVL" too: with both keys listed, the NVL is priced by
    its own and the SXM by "H100"; two longest keys of equal length are no price."""
    prices = Prices({"H100": 2.49, "H100 NVL": 2.10, "A100": 1.29, "80GB": 9.0})
    assert prices.match("cuda", "NVIDIA H100 NVL") == ("H100 NVL", "")
    assert prices.match("cuda", "NVIDIA H100 SXM") == ("H100", "")
    assert prices.match("cuda", "NVIDIA A100-SXM4-80GB") == (None, (
        "several keys of cost.device_hour match the device 'NVIDIA A100-SXM4-80GB': '80GB', "
        "'A100'"
    ))  # fmt: skip
    both = StudyConfig.from_filled({"cost": {"device_hour": {"H100": 2.49, "H100 NVL": 2.1}}})
    assert check(both, "cuda", ["NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3"]) is None


def test_pre_flight_names_cost_device_hour():
    cfg = StudyConfig.from_filled({"accelerator": "auto", **CPU_PRICES})
    assert check(cfg, "cpu", []) is None
    no_cpu = StudyConfig.from_filled({"cost": {"device_hour": {"H100": 2.49}}})
    assert "cost.device_hour (H100) has no 'cpu-core' price" in check(no_cpu, "cpu", [])
    assert check(no_cpu, "cuda", ["NVIDIA H100 80GB HBM3"]) is None
    gpu = check(no_cpu, "cuda", ["NVIDIA A100-SXM4-80GB"])
    assert "no key of cost.device_hour matches the device 'NVIDIA A100-SXM4-80GB'" in gpu
    assert check(no_cpu, "cuda", []) is None  # a login node: named in the report instead
    by_cost = StudyConfig.from_filled({"report": {"rank_by": "cost"}})
    assert "report.rank_by: cost needs prices" in check(by_cost, "cpu", [])


def test_cheapest_and_fastest_on_the_pareto_front():
    pts = pd.DataFrame({"t": [1.0, 2.0, 3.0, 2.5], "c": [3.0, 2.0, 1.0, 2.5]})
    assert cost.pareto(pts, "t", "c").tolist() == [True, True, True, False]


def test_report_with_prices_has_the_cost_table_figure_and_ranking(torch_study, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**CPU_PRICES, "report": {"rank_by": "cost"}}))
    runs_dir = torch_study["results"] / "runs"
    p = subprocess.run(
        [PYTHON, "-m", "trainscale", "report", "--runs-dir", str(runs_dir), "--out",
         str(tmp_path / "out"), "--config", str(cfg)],
        cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "out"
    scaling = pd.read_csv(out / "scaling.csv")
    assert {"device_hours_per_million", "cost_per_million", "kwh_per_million"} <= set(scaling)
    assert {f"cost_per_million_{s}" for s in ("mean", "std", "ci95")} <= set(scaling)
    page = (out / "report.html").read_text()
    table = page[page.index('id="cost"') : page.index('id="per-class"')]
    # N = 1: torch and torch-ddp; the Cost table lists the cheapest first
    one = scaling[scaling["world_size"] == 1].sort_values("cost_per_million")
    first, second = one["strategy"].tolist()
    assert table.index(f"<b>{first}</b>") < table.index(f"<td>{second}</td>")
    assert "cost per million" in table and "EUR" in table
    assert "Time against cost per million" in page  # the cost-time figure, drawn
    assert "Strategies ranked by cost per million tokens or samples" in page  # report.rank_by
    assert (out / "figures" / "cost_time.png").stat().st_size > 10_000
    assert "no data in this study for time against cost" not in page


def test_a_study_with_prices_costs_its_cells_through_snakemake(torch_study):
    """.test/config.yaml prices a cpu-core: scaling.csv, summary.txt and report.html of the
    Snakemake rules carry the cost."""
    results = torch_study["results"]
    scaling = pd.read_csv(results / "scaling.csv")
    assert scaling["cost_per_million"].notna().all() and (scaling["currency"] == "EUR").all()
    page = (results / "report.html").read_text()
    assert 'id="cost"' in page and "Time against cost per million" in page
    assert (results / "figures" / "cost_time.png").exists()

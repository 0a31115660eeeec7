"""Study tables: per-cell statistics, speedup and efficiency against hand-computed values, from
generated metrics files (and, marked slow, from real small runs)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainscale.analysis import aggregate, metrics_tables
from trainscale.analysis.flags import LOGICAL, OVERSUBSCRIBED, cell_flags
from trainscale.analysis.study import Study, write_csv
from trainscale.measure import flops, metrics
from trainscale.plan.matrix import RunSpec, build_runs

from conftest import base_config

T975 = {2: 12.706204736174694, 3: 4.302652729749462, 4: 3.182446305284263}  # t(0.975, n − 1)


# --------------------------------------------------------------------------------------------
# generated metrics files (shared with test_report.py)


def spec_for(
    strategy: str = "torch-ddp",
    workers: int = 1,
    *,
    repeat: int = 0,
    batch_size: int = 64,
    batch_mode: str = "global",
    scale: int = 1,
    model: str = "seed-small",
    dataset: str = "digits",
    nodes: int = 1,
    epochs: int = 3,
    target_accuracy: float | None = 0.9,
) -> RunSpec:
    cfg = base_config(
        strategy=[strategy],
        workers=[workers],
        nodes=[nodes],
        batch_size=[batch_size],
        batch_mode=[batch_mode],
        scale=[scale],
        model=[model],
        dataset=[dataset],
    )
    (spec,), _ = build_runs(cfg, accelerator="cuda")
    return dataclasses.replace(
        spec, repeat=repeat, seed=repeat, epochs=epochs, target_accuracy=target_accuracy
    )


def ok_record(
    spec: RunSpec,
    steady: list[float],
    first: float = 2.0,
    samples: int = 1000,
    accuracy: list[float] | None = None,
    losses: list[float] | None = None,
    rss: int = 400 * 2**20,
    oversubscribed: bool = False,
    data_wait: float = 0.02,
) -> dict:
    """An ok run whose epochs take `first`, then `steady` seconds for `samples` samples each,
    a `data_wait` share of each spent waiting for data."""
    secs = [first, *steady]
    accuracy = accuracy or [0.5 + 0.1 * i for i in range(len(secs))]
    losses = losses or [2.0 / (i + 1) for i in range(len(secs))]
    epochs = [
        {
            "epoch": i + 1,
            "seconds": s,
            "samples": samples,
            "steps": 10,
            "samples_per_second": samples / s,
            "train_loss": losses[i],
            "step_seconds_p50": s / 10,
            "step_seconds_p95": s / 8,
            "test_accuracy": accuracy[i],
            "test_loss": losses[i],
            "data_wait_seconds": data_wait * s,
            "data_wait_seconds_max": data_wait * s,
        }
        for i, s in enumerate(secs)
    ]
    rec = metrics.ok_record(spec.to_dict(), epochs, spec.target_accuracy)
    rec.update(
        model={"params": 1000},
        data={"train_samples": samples, "test_samples": 100},
        test={"accuracy": accuracy[-1], "loss": losses[-1]},
        setup_seconds=1.0,
        wall_seconds=10.0,
        oversubscribed=oversubscribed,
        memory={"peak_host_rss_bytes": rss, "peak_device_bytes": None},
        device={
            "kind": "cpu",
            "name": "test cpu",
            "count": spec.workers,
            "utilization_mean": None,
            "energy_joules": None,
        },
    )
    rec["env"]["frameworks"] = {"torch": "2.13.0+cpu"}
    peak = 1e11 * spec.world_size  # a measured peak of 100 GFLOP/s per worker
    rec["flops"] = flops.block(
        {"per_sample": 2e6, "method": "flop_counter", "peak_per_second": peak,
         "peak_source": "measured", "peak_device": "test cpu"},
        rec["throughput"],
    )  # fmt: skip
    return rec


def failed_record(spec: RunSpec, status: str = "oom", error: str = "out of memory") -> dict:
    return metrics.failure_record(
        spec.to_dict(),
        status,
        error,
        metrics.utc_now(),
        3.0,
        {"command": "python -m trainscale.runners", "mode": "local", "exit_code": 1},
    )


def write(runs_dir: Path, spec: RunSpec, record: dict) -> Path:
    path = runs_dir / spec.path / "metrics.json"
    metrics.write(path, record)
    return path


def scaling_study(runs_dir: Path) -> list[Path]:
    """torch N=1 (1 repeat), torch-ddp N=1 and N=2 (3 repeats each) and a per_worker pair."""
    paths = [write(runs_dir, spec_for("torch", 1), ok_record(spec_for("torch", 1), [0.5, 0.5]))]
    for r, t in enumerate([1.0, 1.25, 0.8]):
        s = spec_for("torch-ddp", 1, repeat=r)
        paths.append(write(runs_dir, s, ok_record(s, [t, t], first=t + 1)))
    for r, t in enumerate([0.6, 0.625, 0.65]):
        s = spec_for("torch-ddp", 2, repeat=r)
        paths.append(write(runs_dir, s, ok_record(s, [t, t], first=t + 2, oversubscribed=r == 0)))
    for w, t in ((1, 1.0), (2, 1.25)):  # per_worker: each worker keeps 64, samples double
        s = spec_for("torch-ddp", w, batch_mode="per_worker")
        paths.append(write(runs_dir, s, ok_record(s, [t, t], samples=1000 * w)))
    return paths


def cell(scaling: pd.DataFrame, **keys) -> pd.Series:
    m = np.ones(len(scaling), dtype=bool)
    for k, v in keys.items():
        m &= (scaling[k] == v).to_numpy()
    assert m.sum() == 1, keys
    return scaling[m].iloc[0]


# --------------------------------------------------------------------------------------------
# hand-computed statistics


def test_mean_std_ci_speedup_and_strong_efficiency_by_hand(tmp_path):
    study = Study.build(scaling_study(tmp_path / "runs"))
    assert study.invalid == [] and len(study.runs) == 9
    s = study.scaling
    x1 = [1000 / t for t in (1.0, 1.25, 0.8)]  # 2000 samples over 2 steady epochs of t s
    x2 = [1000 / t for t in (0.6, 0.625, 0.65)]
    one = cell(s, strategy="torch-ddp", world_size=1, batch_mode="global")
    two = cell(s, strategy="torch-ddp", world_size=2, batch_mode="global")
    assert one["throughput_mean"] == pytest.approx(sum(x1) / 3)
    sd1 = math.sqrt(sum((x - sum(x1) / 3) ** 2 for x in x1) / 2)
    assert one["throughput_std"] == pytest.approx(sd1)
    assert one["throughput_ci95"] == pytest.approx(T975[3] * sd1 / math.sqrt(3))
    assert two["speedup"] == pytest.approx((sum(x2) / 3) / (sum(x1) / 3))
    t1, t2 = (1.0 + 1.25 + 0.8) / 3, (0.6 + 0.625 + 0.65) / 3
    assert two["strong_efficiency"] == pytest.approx(t1 / (2 * t2))
    assert two["efficiency"] == two["strong_efficiency"] and two["efficiency_kind"] == "strong"
    assert pd.isna(two["weak_efficiency"])
    assert one["speedup"] == pytest.approx(1.0) and one["efficiency"] == pytest.approx(1.0)
    # first-epoch overhead: epoch 1 − steady per run (1 s and 2 s by construction)
    assert one["first_epoch_overhead_seconds_mean"] == pytest.approx(1.0)
    assert two["first_epoch_overhead_seconds_mean"] == pytest.approx(2.0)
    assert two["first_epoch_overhead_seconds_std"] == pytest.approx(0.0, abs=1e-12)
    assert bool(two["oversubscribed"]) and not bool(one["oversubscribed"])
    assert two["baseline_note"] == ""


def test_weak_efficiency_and_speedup_vs_best_single_process(tmp_path):
    study = Study.build(scaling_study(tmp_path / "runs"))
    s = study.scaling
    weak = cell(s, strategy="torch-ddp", world_size=2, batch_mode="per_worker")
    x1, x2 = 2000 / 2.0, 4000 / 2.5
    assert weak["speedup"] == pytest.approx(x2 / x1)
    assert weak["weak_efficiency"] == pytest.approx(x2 / (2 * x1))
    assert weak["efficiency_kind"] == "weak" and pd.isna(weak["strong_efficiency"])
    # torch at N=1 (2000 samples/s) is the fastest single process for batch 64 global
    two = cell(s, strategy="torch-ddp", world_size=2, batch_mode="global")
    x2_mean = sum(1000 / t for t in (0.6, 0.625, 0.65)) / 3
    assert two["single_best_strategy"] == "torch"
    assert two["speedup_vs_single"] == pytest.approx(x2_mean / 2000)
    # torch and torch-ddp are separate strategies: ddp's speedup is against ddp N=1
    assert two["baseline_throughput"] == pytest.approx(sum(1000 / t for t in (1, 1.25, 0.8)) / 3)


def test_single_repeat_has_no_std_or_ci(tmp_path):
    study = Study.build(scaling_study(tmp_path / "runs"))
    torch = cell(study.scaling, strategy="torch")
    assert torch["throughput_mean"] == pytest.approx(2000)
    assert torch["throughput_n"] == 1
    assert pd.isna(torch["throughput_std"]) and pd.isna(torch["throughput_ci95"])
    assert aggregate.ci95([3.0]) == (
        3.0,
        pytest.approx(math.nan, nan_ok=True),
        pytest.approx(math.nan, nan_ok=True),
    )


def test_ci95_matches_student_t():
    for n, t in T975.items():
        xs = [1.0 + i * 0.5 for i in range(n)]
        mean, sd, ci = aggregate.ci95(xs)
        assert ci == pytest.approx(t * np.std(xs, ddof=1) / math.sqrt(n))
        assert aggregate.t975(n) == pytest.approx(t)


def test_t975_is_scipys_quantile_without_scipy():
    """The closed-form quantile agrees with scipy's to 1e-12 at every sample size a study can
    have (scipy is a test dependency only here), and is NaN below two runs."""
    from scipy.special import stdtrit

    n = np.array([*range(2, 302), 1001, 10001], dtype=float)
    assert aggregate.t975(n) == pytest.approx(stdtrit(n - 1, 0.975), rel=1e-12)
    assert np.isnan(aggregate.t975(np.array([0.0, 1.0, np.nan]))).all()


def test_failed_runs_are_counted_not_averaged_and_missing_baselines_say_why(tmp_path):
    runs = tmp_path / "runs"
    paths = []
    for r, t in enumerate([1.0, 0.5]):
        s = spec_for("torch-ddp", 2, repeat=r)
        paths.append(write(runs, s, ok_record(s, [t, t])))
    s = spec_for("torch-ddp", 2, repeat=2)
    paths.append(write(runs, s, failed_record(s, "oom", "CUDA out of memory\nTraceback ...")))
    # a batch-128 cell whose N=1 baseline only failed
    base = spec_for("torch-ddp", 1, batch_size=128)
    paths.append(write(runs, base, failed_record(base, "timeout", "killed after 30 min")))
    s = spec_for("torch-ddp", 2, batch_size=128)
    paths.append(write(runs, s, ok_record(s, [1.0, 1.0])))
    study = Study.build(paths)
    sc = study.scaling
    c = cell(sc, batch_size=64, world_size=2)
    assert (c["runs"], c["ok"], c["failed"], c["statuses"]) == (3, 2, 1, "2 ok, 1 oom")
    assert c["throughput_mean"] == pytest.approx((1000 + 2000) / 2)
    assert pd.isna(c["speedup"]) and pd.isna(c["efficiency"])
    assert "no N=1 run of torch-ddp" in c["baseline_note"]
    c = cell(sc, batch_size=128, world_size=2)
    assert pd.isna(c["speedup"])
    assert c["baseline_note"] == "the N=1 cell of torch-ddp has no ok run (1 timeout)"
    c = cell(sc, batch_size=128, world_size=1)
    assert c["ok"] == 0 and c["baseline_note"].startswith("no ok run in this cell")
    # failed runs stay in runs.csv with their status and error
    failed = study.runs[study.runs["status"] != "ok"]
    assert sorted(failed["status"]) == ["oom", "timeout"]
    assert failed["error"].str.len().min() > 0
    text = aggregate.summary_text(study.runs, study.invalid, "t", sc)
    assert "[oom]" in text and "CUDA out of memory" in text and "no N=1 run" in text


def test_time_to_accuracy_counts_the_runs_that_reached_it(tmp_path):
    runs = tmp_path / "runs"
    paths = []
    for r, acc in enumerate([[0.5, 0.95, 0.96], [0.5, 0.6, 0.92], [0.5, 0.6, 0.7]]):
        s = spec_for("torch", 1, repeat=r)
        paths.append(write(runs, s, ok_record(s, [1.0, 1.0], first=2.0, accuracy=acc)))
    c = Study.build(paths).scaling.iloc[0]
    assert c["time_to_accuracy_seconds_n"] == 2  # 3.0 s and 4.0 s; the third never reached 0.9
    assert c["time_to_accuracy_seconds_mean"] == pytest.approx(3.5)
    assert c["test_accuracy_mean"] == pytest.approx((0.96 + 0.92 + 0.7) / 3)


def test_invalid_files_are_listed_and_the_rest_is_counted(tmp_path):
    runs = tmp_path / "runs"
    paths = scaling_study(runs)
    bad_json = runs / "strategy~torch" / "broken" / "metrics.json"
    bad_json.parent.mkdir(parents=True)
    bad_json.write_text("{not json")
    wrong = runs / "strategy~torch" / "wrong" / "metrics.json"
    wrong.parent.mkdir(parents=True)
    wrong.write_text(json.dumps({"schema": "trainscale.metrics/1", "status": "ok"}))
    found = aggregate.find_metrics(runs)
    assert len(found) == len(paths) + 2
    study = Study.build(found)
    assert len(study.runs) == len(paths)
    assert {Path(p).parent.name for p, _ in study.invalid} == {"broken", "wrong"}
    assert all(why for _, why in study.invalid)
    text = aggregate.summary_text(study.runs, study.invalid, "t", study.scaling)
    assert "invalid metrics files (not counted)" in text and "broken" in text


def test_parallel_loading_matches_serial(tmp_path, monkeypatch):
    paths = scaling_study(tmp_path / "runs")
    (tmp_path / "bad.json").write_text("[]")
    paths.append(tmp_path / "bad.json")
    monkeypatch.setattr(metrics_tables, "PARALLEL_FROM", 2)
    monkeypatch.setattr(metrics_tables, "CHUNK", 3)  # several chunks per worker
    serial = aggregate.load(paths, jobs=1)
    parallel = aggregate.load(paths, jobs=2)
    assert parallel == serial and len(serial[1]) == 1
    runs, epochs, invalid = metrics_tables.read_tables(paths, jobs=1)
    runs2, epochs2, invalid2 = metrics_tables.read_tables(paths, jobs=2)
    pd.testing.assert_frame_equal(runs2, runs)
    pd.testing.assert_frame_equal(epochs2, epochs)
    assert invalid2 == invalid == serial[1]
    assert list(runs["run"]) == [r["run"] for r in serial[0]]


def test_fastest_per_model_and_worker_count(tmp_path):
    study = Study.build(scaling_study(tmp_path / "runs"))
    f = study.fastest.set_index("world_size")
    assert f.loc[1, "strategy"] == "torch"  # 2000 samples/s against ddp's ~1000
    assert f.loc[1, "runner_up"] == "torch-ddp"
    assert f.loc[1, "distinct"] is None or f.loc[1, "distinct"] in (True, False)
    assert f.loc[2, "strategy"] == "torch-ddp" and f.loc[2, "batch_mode"] == "global"
    assert not isinstance(f.loc[2, "runner_up"], str)  # no other strategy ran at N=2
    text = aggregate.summary_text(study.runs, [], "t", study.scaling)
    assert "seed-small on digits, N=1: torch " in text
    assert "strong efficiency" in text and "oversubscribed" in text


def test_tables_round_trip_through_csv(tmp_path):
    study = Study.build(scaling_study(tmp_path / "runs"), name="t")
    study.write(tmp_path / "out")
    for f in ("runs.csv", "epochs.csv", "scaling.csv", "invalid.csv", "summary.txt"):
        assert (tmp_path / "out" / f).exists(), f
    # scaling recomputed from runs.csv alone equals the one built from the metrics files
    back = Study.read({t: tmp_path / "out" / f"{t}.csv" for t in ("runs", "epochs", "invalid")})
    cols = ["throughput_mean", "throughput_ci95", "speedup", "efficiency", "speedup_vs_single"]
    pd.testing.assert_frame_equal(back.scaling[cols], study.scaling[cols])
    assert back.runs["oversubscribed"].dtype == bool
    assert len(back.epochs) == 9 * 3
    assert back.convergence["train_loss_mean"].notna().all()


def test_tables_are_written_as_pandas_writes_them(tmp_path):
    """study.write's CSV writer gives to_csv's bytes: missing values empty, quoting, floats at
    full precision, nullable and extension types, and a table's own columns."""
    df = pd.DataFrame(
        {
            "f": [1.0, np.nan, 1e16, 1e-7, np.inf, 0.1],
            "i": [1, 2, 3, 4, 5, 6],
            "s": pd.array(["a", None, 'x,"y"', "line\nbreak", "", "é"], dtype="string"),
            "b": [True, False, True, True, False, False],
            "nb": pd.array([True, None, False, True, None, False], dtype="boolean"),
            "ni": pd.array([1, None, 3, 4, 5, None], dtype="Int64"),
            "o": ["a", None, 1, 2.5, "q", "r"],
            "f32": np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=np.float32),
            "t": pd.to_datetime(["2026-01-01 10:00:00.5"] * 6),
        }
    )
    study = Study.build(scaling_study(tmp_path / "runs"), name="t")
    tables = [df, df[["f", "i", "s", "nb", "ni", "o"]], df.iloc[0:0], study.runs, study.epochs]
    for n, table in enumerate([*tables, study.scaling]):
        table.to_csv(tmp_path / "pandas.csv", index=False)
        write_csv(table, tmp_path / "ours.csv")
        want = (tmp_path / "pandas.csv").read_bytes()
        assert (tmp_path / "ours.csv").read_bytes() == want, n


def test_tables_written_side_by_side_are_the_same_files(tmp_path):
    """Study.write with jobs > 1 (epochs.csv by a forked process) writes what jobs=1 writes,
    and a failure in that process is an error, not a missing file."""
    study = Study.build(scaling_study(tmp_path / "runs"), name="t")
    study.write(tmp_path / "one")
    study.write(tmp_path / "two", jobs=2)
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "epochs.csv" in names and names == sorted(p.name for p in (tmp_path / "two").iterdir())
    for name in names:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    outputs = {"runs": tmp_path / "o" / "runs.csv", "epochs": tmp_path / "o" / "nodir"}
    outputs["epochs"].mkdir(parents=True)  # a directory where the file should go
    with pytest.raises(RuntimeError, match="writing epochs.csv failed"):
        study.write(outputs, jobs=2)
    assert outputs["runs"].exists()  # the rest is still written


def test_read_gives_back_what_was_written_with_its_types(tmp_path):
    """Every table, dtypes included: nothing re-types a column after a round trip."""
    paths = scaling_study(tmp_path / "runs")
    (tmp_path / "runs" / "bad").mkdir()
    (tmp_path / "runs" / "bad" / "metrics.json").write_text("{")
    study = Study.build(aggregate.find_metrics(tmp_path / "runs"), name="t")
    assert len(study.invalid) == 1
    study.write(tmp_path / "out")
    back = Study.read(tmp_path / "out")
    assert back.name == "t" and back.invalid == study.invalid
    for table in ("runs", "epochs", "scaling", "collectives", "communication"):
        pd.testing.assert_frame_equal(getattr(back, table), getattr(study, table), obj=table)
    assert back.runs["spec.study"].dtype == "str" and back.runs["error"].dtype == "str"
    assert back.scaling["baseline_note"].isin([""]).any()  # "" stays a note, not a NaN
    assert (tmp_path / "out" / "summary.txt").read_text() == study.summary()
    assert paths


def test_write_and_read_name_the_tables_like_snakemake_does(tmp_path):
    """Snakemake's named input/output: only the tables named are read or written."""
    paths = scaling_study(tmp_path / "runs")
    study = Study.build(paths, name="t")
    study.write({"runs": tmp_path / "runs.csv", "summary": tmp_path / "summary.txt"})
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["runs.csv", "summary.txt"]
    df = pd.read_csv(tmp_path / "runs.csv")
    assert len(df) == 9 and list(df.columns[:3]) == ["run", "status", "spec.strategy"]
    assert "fastest strategy" in (tmp_path / "summary.txt").read_text()
    back = Study.read({"runs": tmp_path / "runs.csv", "figures": ["ignored.png"]}, name="u")
    assert back.name == "u" and len(back.scaling) == len(study.scaling) and not back.invalid
    with pytest.raises(FileNotFoundError, match="runs.csv"):
        Study.read(tmp_path / "nothing-here")


def test_public_functions_kept_working(tmp_path):
    paths = scaling_study(tmp_path / "runs")
    assert aggregate.run_id(paths[0]).startswith("strategy~torch/")
    assert aggregate.human(12721) == "12,700" and aggregate.human(0.51338) == "0.513"
    assert aggregate.human(1) == "1.00" and aggregate.human(99.96) == "100"
    assert aggregate.human(None) == "n/a" and aggregate.human(-0.0155) == "-0.0155"


# --------------------------------------------------------------------------------------------
# real runs


@pytest.mark.slow
def test_tables_from_real_small_runs(tmp_path, torch_study):
    """torch on 1 worker and torch-ddp on 1 and 2 workers, for real, 2 epochs of digits: the
    runs of `.test/config.yaml` (conftest.torch_study)."""
    paths = torch_study["files"]
    got = sorted(
        (metrics.read(p)["spec"]["strategy"], metrics.read(p)["spec"]["workers"]) for p in paths
    )
    assert got == [("torch", 1), ("torch-ddp", 1), ("torch-ddp", 2)]
    study = Study.build(paths)
    assert study.invalid == [] and (study.runs["status"] == "ok").all()
    recs = {aggregate.run_id(p): metrics.read(p) for p in paths}
    by = {(r["spec"]["strategy"], r["spec"]["world_size"]): r for r in recs.values()}
    s = study.scaling
    two = cell(s, strategy="torch-ddp", world_size=2)
    x1, x2 = by[("torch-ddp", 1)]["throughput"], by[("torch-ddp", 2)]["throughput"]
    t1 = by[("torch-ddp", 1)]["steady_epoch_seconds"]
    t2 = by[("torch-ddp", 2)]["steady_epoch_seconds"]
    assert two["speedup"] == pytest.approx(x2 / x1)
    assert two["strong_efficiency"] == pytest.approx(t1 / (2 * t2))
    best1 = max(x1, by[("torch", 1)]["throughput"])
    assert two["speedup_vs_single"] == pytest.approx(x2 / best1)
    assert len(study.epochs) == 3 * 2 and study.convergence["train_loss_mean"].notna().all()
    # and the figures and report of those real runs
    from trainscale.report import figures
    from trainscale.report import html as report

    drawn = figures.render_all(study, tmp_path / "figures", jobs=2)
    assert drawn["throughput"].note is None and drawn["speedup"].note is None
    page = report.write_html(study, tmp_path / "report.html", tmp_path / "figures", drawn=drawn)
    text = page.read_text()
    assert "torch-ddp" in text and "Methods" in text and 'src="data:image/png;base64,' in text


def test_logical_device_runs_are_labelled_in_tables_and_summary(tmp_path):
    """tf-mirrored over logical CPU devices proves the code path, not a speed-up: say so."""
    paths = []
    for w in (1, 2):
        s = spec_for("tf-mirrored", w)
        rec = ok_record(s, [1.0, 1.0])
        rec["device"]["logical"] = w > 1
        paths.append(write(tmp_path / "runs", s, rec))
    study = Study.build(paths, name="logical")
    by_n = study.scaling.set_index("world_size")["logical"]
    assert bool(by_n[2]) and not bool(by_n[1])
    text = aggregate.summary_text(study.runs, [], "logical", study.scaling)
    assert f"not ranked ({LOGICAL.note}):" in text and "  logical devices" in text


def test_cell_flags_word_each_flag_once():
    """summary.txt, the report, the ranking and a card take a cell's flags from one place."""
    row = pd.Series({"oversubscribed": True, "logical": True}).to_dict()
    assert cell_flags(row) == [OVERSUBSCRIBED, LOGICAL]
    plain = next(pd.DataFrame({"oversubscribed": [False], "logical": [float("nan")]}).itertuples())
    assert cell_flags(plain) == [] and cell_flags({}) == []
    assert LOGICAL.note == "logical CPU devices in one process: a code-path check, not a speed-up"

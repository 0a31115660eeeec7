import json

import numpy as np
import pytest

from trainscale.measure import metrics, steptimes
from trainscale.plan.matrix import build_runs

from conftest import base_config


def spec_dict(**m):
    runs, _ = build_runs(base_config(**m))
    return runs[0].to_dict()


def epochs():
    return [
        {
            "epoch": 1,
            "seconds": 4.0,
            "samples": 1000,
            "steps": 10,
            "samples_per_second": 250.0,
            "train_loss": 2.0,
            "step_seconds_p50": 0.3,
            "step_seconds_p95": 0.9,
            "test_accuracy": 0.5,
            "test_loss": 1.5,
        },
        {
            "epoch": 2,
            "seconds": 2.0,
            "samples": 1000,
            "steps": 10,
            "samples_per_second": 500.0,
            "train_loss": 1.0,
            "step_seconds_p50": 0.2,
            "step_seconds_p95": 0.25,
            "test_accuracy": 0.8,
            "test_loss": 0.7,
        },
        {
            "epoch": 3,
            "seconds": 3.0,
            "samples": 1000,
            "steps": 10,
            "samples_per_second": 333.3,
            "train_loss": 0.5,
            "step_seconds_p50": 0.2,
            "step_seconds_p95": 0.3,
            "test_accuracy": 0.9,
            "test_loss": 0.4,
        },
    ]


def test_derived_figures_by_hand():
    d = metrics.derived(epochs(), world_size=4, target_accuracy=0.75)
    assert d["first_epoch_seconds"] == 4.0
    assert d["steady_epoch_seconds"] == pytest.approx(2.5)
    assert d["throughput"] == pytest.approx(2000 / 5.0)  # epochs 2..3: samples / seconds
    assert d["throughput_per_worker"] == pytest.approx(100.0)
    assert d["time_to_accuracy_seconds"] == pytest.approx(6.0)  # reached after epoch 2
    assert metrics.derived(epochs(), 1, 0.95)["time_to_accuracy_seconds"] is None
    assert metrics.derived(epochs(), 1, None)["time_to_accuracy_seconds"] is None


@pytest.mark.parametrize("q", [0, 25, 50, 95, 100])
def test_percentile_matches_numpy(q):
    xs = [0.3, 0.1, 0.2, 0.9, 0.4, 0.11]
    assert steptimes.percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert steptimes.percentile([], q) is None


@pytest.mark.parametrize("steps", [1, 5, 8, 9, 22, 89])
def test_batch_means_cover_every_step_in_blocks_a_step_apart_at_most(steps):
    xs = [0.1 + 0.01 * (i % 7) for i in range(steps)]
    bounds = steptimes.block_bounds(steps)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == steps  # every step in one block
    assert len(sizes) == min(steps, steptimes.BLOCKS) and sizes.max() - sizes.min() <= 1
    means = steptimes.batch_means(xs)
    expected = [np.mean(xs[i:j]) for i, j in zip(bounds, bounds[1:], strict=False)]
    assert means == pytest.approx(expected)
    assert steptimes.batch_means([]) is None


def test_every_epoch_records_its_batch_means_and_tf_ps_none():
    rec = metrics.Recorder(spec_dict())
    e = rec.epoch(2.2, samples=1000, steps=22, train_loss=1.0, step_seconds=[0.1] * 22)
    assert e["step_batch_means"] == pytest.approx([0.1] * 8)
    ps = rec.epoch(1.0, samples=10, steps=1, train_loss=1.0, step_seconds=[])
    assert ps["step_batch_means"] is None and ps["step_seconds_p50"] is None


def test_ok_record_validates_and_failed_needs_error(tmp_path):
    rec = metrics.ok_record(spec_dict(), epochs(), None)
    rec["model"]["params"] = 10
    metrics.validate(rec)
    bad = dict(rec, status="failed")
    with pytest.raises(metrics.MetricsError, match="error"):
        metrics.validate(bad)
    fail = metrics.failure_record(
        spec_dict(),
        "oom",
        "out of memory\nTraceback",
        metrics.utc_now(),
        1.0,
        {"command": "x", "mode": "local", "exit_code": 1},
    )
    metrics.validate(fail)
    ok_without_throughput = dict(rec, throughput=None)
    with pytest.raises(metrics.MetricsError, match="throughput"):
        metrics.validate(ok_without_throughput)


def test_write_is_atomic_and_read_validates(tmp_path):
    rec = metrics.failure_record(
        spec_dict(), "failed", "boom", metrics.utc_now(), 1.0, {"command": None}
    )
    out = tmp_path / "a" / "metrics.json"
    metrics.write(out, rec)
    assert metrics.read(out) == rec
    assert [p.name for p in out.parent.iterdir()] == ["metrics.json"]  # no temp file left
    # an invalid record is refused and the old file stays whole
    with pytest.raises(metrics.MetricsError):
        metrics.write(out, {"schema": "nope"})
    assert metrics.read(out) == rec
    assert [p.name for p in out.parent.iterdir()] == ["metrics.json"]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(metrics.MetricsError, match="not readable JSON"):
        metrics.read(tmp_path / "bad.json")
    (tmp_path / "wrong.json").write_text(json.dumps({"schema": "trainscale.metrics/1"}))
    with pytest.raises(metrics.MetricsError, match="wrong.json"):
        metrics.read(tmp_path / "wrong.json")


def test_gpu_monitor_without_nvml_reports_nothing():
    mon = metrics.GpuMonitor(read=metrics.GpuMonitor.nvml_reader(0)).start()
    assert mon.stop() == (None, None)  # this machine has no NVIDIA driver


def test_gpu_monitor_arithmetic_with_a_reader():
    # NVML cannot run here; feed the monitor a reader with known values to check its sums.
    readings = iter([(0.0, 1000.0)] + [(50.0, None)] * 3 + [(70.0, 31000.0)])
    mon = metrics.GpuMonitor(interval=0.01, read=lambda: next(readings, (50.0, None)))
    mon.start()
    import time

    while len(mon._samples) < 3:
        time.sleep(0.005)
    mon._read = lambda: (70.0, 31000.0)
    util, energy = mon.stop()
    assert 50.0 <= util <= 70.0
    assert energy == pytest.approx(30.0)  # (31000 - 1000) mJ


def test_oversubscription():
    assert not metrics.oversubscribed(2, 1, 2)
    assert metrics.oversubscribed(2, 2, 2)


def test_recorder_reports_no_accuracy_for_synthetic_data():
    """Synthetic labels are random: accuracy is not applicable, whatever the runner measured."""
    for dataset, expect_none in (("synthetic-mnist", True), ("digits", False)):
        rec = metrics.Recorder(spec_dict(dataset=[dataset]))
        rec.training_starts()
        for e in epochs():
            rec.epoch(
                e["seconds"],
                e["samples"],
                e["steps"],
                e["train_loss"],
                [0.1, 0.2],
                test_accuracy=0.5,
                test_loss=1.0,
            )
        out = rec.record(test={"accuracy": 0.5, "loss": 1.0}, model={"params": 1})
        assert (out["test"]["accuracy"] is None) is expect_none
        assert (out["epochs"][-1]["test_accuracy"] is None) is expect_none
        metrics.validate(out)


def test_driver_version_comes_from_nvml_where_there_is_a_driver():
    import pathlib

    has_driver = pathlib.Path("/proc/driver/nvidia/version").exists()
    version = metrics.driver_version()
    assert (version is not None) is has_driver
    assert version is None or version[0].isdigit()


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2.5, "x", null, true], "b": {"c": -0.0}}',
        '{"loss": NaN, "peak": Infinity, "low": -Infinity}',  # json.dump writes these
        '\ufeff{"bom": 1}',
        '{"dup": 1, "dup": 2}',
    ],
)
def test_parse_reads_what_json_reads(text):
    """metrics.parse (orjson, json where orjson refuses) gives what json.loads gives."""
    data = text.encode()
    want, got = json.loads(data), metrics.parse(data)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]


@pytest.mark.parametrize("data", [b"{not json", b'{"a": ', b"\xff{}", b""])
def test_parse_refuses_what_json_refuses_with_its_message(data):
    with pytest.raises(ValueError) as want:
        json.loads(data)
    with pytest.raises(ValueError) as got:
        metrics.parse(data)
    assert str(got.value) == str(want.value)

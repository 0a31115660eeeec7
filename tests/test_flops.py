"""MFU's parts (trainscale.measure.flops): the datasheet table, the measured peak kept beside
the study, and the block every record carries."""

import json
import math

import pytest

from trainscale.measure import flops

T = 1e12


@pytest.mark.parametrize(("name", "precision", "tf32", "peak"), [
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989.4 * T),
    ("NVIDIA H100 80GB HBM3", "fp32", False, 67 * T),
    ("NVIDIA H100 80GB HBM3", "fp32", True, 494.7 * T),
    ("NVIDIA H100 PCIe", "fp16", False, 756 * T),
    ("NVIDIA H200", "bf16", False, 989.4 * T),
    ("NVIDIA A100-SXM4-80GB", "bf16", False, 312 * T),
    ("NVIDIA L40S", "fp32", False, 91.6 * T),
    ("Tesla V100-SXM2-32GB", "fp16", False, 125 * T),
    ("Tesla V100-PCIE-16GB", "fp32", False, 14 * T),
    ("AMD Instinct MI300X", "bf16", False, 1307.4 * T),
    ("NVIDIA B200", "bf16", False, 2250 * T),
])  # fmt: skip
def test_datasheet_peaks_are_dense_figures(name, precision, tf32, peak):
    assert flops.datasheet_peak(name, precision, tf32=tf32) == pytest.approx(peak)


def test_no_row_or_no_tensor_cores_means_no_datasheet_peak():
    assert flops.datasheet_peak("NVIDIA GeForce RTX 4090", "bf16") is None
    assert flops.datasheet_peak("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 units
    assert flops.datasheet_peak("Intel(R) Xeon(R) Processor", "fp32") is None


def test_every_row_names_its_precisions():
    for _, row in flops.PEAKS:
        assert set(row) == {"bf16", "fp16", "tf32", "fp32"}


def test_block_adds_achieved_flops_and_mfu():
    b = flops.block(
        {"per_sample": 2e9, "method": "flop_counter", "peak_per_second": 4e12,
         "peak_source": "measured", "peak_device": "cpu"},
        throughput=1000.0,
    )  # fmt: skip
    assert b["achieved_per_second"] == 2e12
    assert b["mfu"] == 0.5
    assert b["analytic_per_sample"] is None


def test_block_is_null_where_nothing_was_counted():
    assert set(flops.block(None, 10.0).values()) == {None}
    assert flops.block({"per_sample": 5.0, "peak_per_second": 9.0}, None)["mfu"] is None


def test_measured_peak_is_timed_once_per_host_and_key(tmp_path):
    calls = []

    def measure() -> float:
        calls.append(1)
        return 123.0

    for _ in range(3):
        assert flops.measured_peak(tmp_path, "node1", "cpu:fp32:threads=1", measure) == 123.0
    assert len(calls) == 1
    assert flops.measured_peak(tmp_path, "node1", "cpu:bf16:threads=1", lambda: 7.0) == 7.0
    kept = json.loads((tmp_path / "node1.json").read_text())
    assert kept == {"cpu:bf16:threads=1": 7.0, "cpu:fp32:threads=1": 123.0}


def test_gemm_rate_is_two_flops_per_multiply_add():
    rate = flops.gemm_flops_per_second(lambda: None, side=100, sync=lambda: None, repeats=2)
    assert rate > 2 * 100**3  # a call that does nothing: more than 2·n³ per second
    assert math.isfinite(rate)


def test_peaks_live_beside_the_study(tmp_path):
    run = "strategy~torch/model~m/repeat~1"
    out = tmp_path / "results" / "s" / "runs" / run / "metrics.json"
    assert flops.peaks_dir(run, out) == (tmp_path / "results" / "s" / "peaks").resolve()
    elsewhere = tmp_path / "x" / "metrics.json"
    assert flops.peaks_dir(run, elsewhere) == (tmp_path / "x" / "peaks").resolve()


def test_peak_is_the_datasheets_for_a_listed_gpu_else_measured(tmp_path):
    def gemm() -> float:
        raise AssertionError("a listed GPU needs no measurement")

    assert flops.peak("NVIDIA A100-SXM4-80GB", "bf16", "k", tmp_path, "h", gemm) == (
        312 * T,
        "datasheet",
    )
    assert flops.peak("Tesla V100-SXM2-32GB", "bf16", "v", tmp_path, "h", lambda: 5.0) == (
        5.0,
        "measured",
    )  # no bf16 units: measured
    assert flops.peak(None, "fp32", "cpu", tmp_path, "h", lambda: 7.0) == (7.0, "measured")

"""Model FLOPs and MFU: how close a run came to what its devices can do.

Definitions (the `flops` block of metrics.json):

- per_sample: the floating-point operations of one training step (forward and backward) for
  one sample, counted once per run by `torch.utils.flop_counter.FlopCounterMode` on the run's
  model built on the meta device at batch 1 (matrix multiplies and convolutions, 2 FLOPs per
  multiply-add; normalisations, activations and the optimizer are not counted, as in MFU's
  definition). For a GPT the sample is one sequence of seq_len tokens.
- analytic_per_sample (GPT only): PaLM's count (appendix B), (6·N + 12·L·H·Q·T) · T per
  sequence, N the parameters without the position table (trainscale.models.gpt). The counter
  gives exactly this less 6·(2L + 1)·C·T, the LayerNorm weights' share of 6·N, which are no
  matmul (tests/test_gpt.py): 0.1% of gpt-nano's count, less for larger models.
- achieved_per_second = per_sample × throughput (steady samples/s over all workers).
- peak_per_second: the devices' dense peak at the run's precision, per device × devices.
  `peak_source` says where it comes from: `datasheet` (PEAKS below, the vendor's document
  named beside each row; sparsity figures never), or `measured` (on CPU, and on a GPU missing
  from the table): the best FLOP/s of a square matrix multiply at the run's dtype, timed once
  per host and kept beside the study (`measured_peak`), an achievable peak rather than a
  theoretical one. On CPU a device is one worker's threads_per_worker threads (the GEMM runs
  at that many), and every framework's runs share PyTorch's GEMM, so their MFUs have one
  denominator. A job running beside the measurement on the same cores lowers it: the best of
  GEMM_REPEATS timings is kept.
- mfu = achieved_per_second / peak_per_second.
- hardware_per_sample: per_sample as the hardware runs it: with activation checkpointing
  (matrix activation_checkpointing), the forward operations recomputed in the backward pass
  counted again (the same counter, on the checkpointed model); under tensor parallelism, what
  the plan leaves whole on every rank of a tp group (an own model's unsplit blocks, an
  embedding and head it does not name) counted once per rank; per_sample without either.
- hfu = hardware_per_sample × throughput / peak_per_second: the hardware FLOPs utilisation.
  MFU stays model FLOPs, without the recomputation, so that a run that recomputes is not
  credited for the work it repeats.
"""

from __future__ import annotations

import fcntl
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Dense peak FLOP/s per device by precision, from each vendor's datasheet (no sparsity).
#: Matched against the device name (torch.cuda.get_device_name) in order, first match wins.
#: fp32 is the non-tensor-core figure: PyTorch runs fp32 matmuls without TF32 unless
#: `torch.backends.cuda.matmul.allow_tf32` is set (`peak_for` then takes the tf32 column).
T = 1e12
PEAKS: tuple[tuple[str, dict[str, float | None]], ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): BF16/FP16 1,979 TFLOPS with
    # sparsity (989.4 dense), TF32 989 with sparsity (494.7 dense), FP32 67
    (
        r"H100.*(SXM|HBM3)|H100 80GB HBM3",
        {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 67 * T},
    ),
    # the same datasheet, H100 PCIe column: BF16/FP16 1,513 sparse (756 dense), TF32 756
    # sparse (378 dense), FP32 51
    (r"H100.*PCIe", {"bf16": 756 * T, "fp16": 756 * T, "tf32": 378 * T, "fp32": 51 * T}),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16/FP16 1,979 sparse, TF32 989
    # sparse, FP32 67
    (r"H200", {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 67 * T}),
    # NVIDIA B200 (HGX B200 datasheet, per GPU): FP16/BF16 4.5 PFLOPS sparse (2.25 dense),
    # TF32 2.2 PFLOPS sparse (1.1 dense), FP32 75 TFLOPS
    (r"B200", {"bf16": 2250 * T, "fp16": 2250 * T, "tf32": 1100 * T, "fp32": 75 * T}),
    # NVIDIA A100 Tensor Core GPU datasheet (40 and 80 GB, SXM and PCIe): BF16/FP16 312,
    # TF32 156, FP32 19.5
    (r"A100", {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T}),
    # NVIDIA L40S datasheet: BF16/FP16 733 sparse (366 dense), TF32 366 sparse (183 dense),
    # FP32 91.6
    (r"L40S", {"bf16": 366 * T, "fp16": 366 * T, "tf32": 183 * T, "fp32": 91.6 * T}),
    # NVIDIA V100 datasheet (SXM2 / PCIe): FP16 tensor 125 / 112, FP32 15.7 / 14; no BF16 or
    # TF32 tensor cores (a bf16 run falls back to a measured peak)
    (r"V100.*PCIE|V100.*PCIe", {"bf16": None, "fp16": 112 * T, "tf32": None, "fp32": 14 * T}),
    (r"V100", {"bf16": None, "fp16": 125 * T, "tf32": None, "fp32": 15.7 * T}),
    # AMD Instinct MI300X data sheet: FP16/BF16 1,307.4 dense (2,614.9 sparse), TF32 653.7,
    # FP32 matrix 163.4
    (r"MI300X", {"bf16": 1307.4 * T, "fp16": 1307.4 * T, "tf32": 653.7 * T, "fp32": 163.4 * T}),
)

#: matrix side of the GEMM benchmark, and how many it times (the best counts)
GEMM_SIDE, GEMM_REPEATS = 1024, 10


def datasheet_peak(device_name: str, precision: str, tf32: bool = False) -> float | None:
    """One device's dense peak FLOP/s at `precision` (fp32 | bf16 | fp16) from PEAKS, or None
    where the device or the precision has no row."""
    column = "tf32" if precision == "fp32" and tf32 else precision
    for pattern, row in PEAKS:
        if re.search(pattern, device_name):
            return row.get(column)
    return None


def gemm_flops_per_second(matmul: Callable[[], object], side: int, sync: Callable[[], None],
                          repeats: int = GEMM_REPEATS) -> float:  # fmt: skip
    """The best FLOP/s of `repeats` timed calls of `matmul` (a side×side×side product, 2·side³
    FLOPs), after one untimed call."""
    matmul()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul()
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * side**3 / best


def peaks_dir(run_path: str, out: str | Path) -> Path:
    """Where a study keeps its measured peaks: results/<study>/peaks for a record at
    results/<study>/runs/<run_path>/metrics.json; beside the record where it lies elsewhere."""
    out = Path(out).resolve()
    depth = len(run_path.split("/"))
    runs = out.parents[depth] if len(out.parents) > depth else out.parent
    at_home = out.parent.as_posix().endswith(run_path) and runs.name == "runs"
    return (runs.parent if at_home else out.parent) / "peaks"


def kept(path: Path, key: str, compute: Callable[[], Any]) -> Any:
    """compute() for `key`, worked out once and kept in the JSON file `path` (beside the
    study): the runs of a study share it. A lock keeps two runs from computing at once (two
    GEMM timings side by side would halve both). Nothing is kept where compute() raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = json.loads(path.read_text()) if path.exists() else {}
        if key not in known:
            known[key] = compute()
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            tmp.replace(path)
    return known[key]


def measured_peak(cache_dir: Path, host: str, key: str, measure: Callable[[], float]) -> float:
    """The GEMM peak of this host for `key` (device, dtype and threads), measured once and
    kept in `cache_dir` (beside the study): the runs of a study on one host share it."""
    return float(kept(cache_dir / f"{host}.json", key, measure))


def cpu_key(name: str, precision: str, threads: int) -> str:
    """The measured-peak key of a CPU at `threads` threads (a worker's threads_per_worker):
    shared by every framework's runs on the host (they all time PyTorch's GEMM)."""
    return f"cpu:{name}:{precision}:threads={threads}"


def peak(gpu_name: str | None, precision: str, key: str, cache_dir: Path, host: str,
         gemm: Callable[[], float], tf32: bool = False) -> tuple[float, str]:  # fmt: skip
    """One device's peak FLOP/s and its source: the datasheet's for a GPU with a row (and the
    precision in it), else `gemm()` (a matrix multiply's best rate on this device) measured
    once per `host` and `key` and kept in `cache_dir`."""
    if gpu_name is not None:
        listed = datasheet_peak(gpu_name, precision, tf32=tf32)
        if listed is not None:
            return listed, "datasheet"
    return measured_peak(cache_dir, host, key, gemm), "measured"


def block(counted: dict | None, throughput: float | None) -> dict:
    """The record's `flops` block from what the runner counted (per_sample, method,
    analytic_per_sample, peak_per_second, peak_source, peak_device) and the run's steady
    throughput: achieved FLOP/s and MFU added; every figure null where it was not counted."""
    out = dict.fromkeys(
        ("per_sample", "analytic_per_sample", "hardware_per_sample", "method",
         "achieved_per_second", "peak_per_second", "peak_source", "peak_device", "mfu", "hfu"),
    )  # fmt: skip
    out.update(counted or {})
    per_sample, peak = out["per_sample"], out["peak_per_second"]
    if out["hardware_per_sample"] is None:  # nothing recomputed: the hardware ran the model's
        out["hardware_per_sample"] = per_sample
    if per_sample is not None and throughput is not None:
        out["achieved_per_second"] = per_sample * throughput
        if peak:
            out["mfu"] = out["achieved_per_second"] / peak
            out["hfu"] = out["hardware_per_sample"] * throughput / peak
    return out

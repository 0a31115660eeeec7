"""The `flops` block of a Keras run (definitions: trainscale.measure.flops).

Keras has no FLOP counter of its own that counts a training step the way PyTorch's does, and
every Keras model here has a PyTorch twin with the same layers and parameter count
(trainscale.models.keras_models, keras_gpt), so a Keras run takes its twin's count:
`method` says "torch twin: flop_counter". Importing torch into a TensorFlow process costs
seconds, so the count of a catalogue model is made once per study and kept beside it, with
the measured peaks (`flops.kept`), keyed also by the counter's sources and torch's version (an
edit to the counter counts again); a user's model is counted in every run. Where torch
cannot be imported (the conda env of the TensorFlow runs has none) the count is null and
`method` says why. The peak is the datasheet's for a GPU in the table, else a matrix multiply
timed on this host at the run's threads and dtype (PyTorch's, as the torch runs time it,
where torch imports; TensorFlow's otherwise).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import tensorflow as tf

from trainscale.measure import flops, metrics
from trainscale.plan.preflight.memory_key import sources_version
from trainscale.plan.runspec import RunSpec

TF_DTYPES = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}


def _twin_count(spec: RunSpec, shape: tuple[int, ...], classes: int, kept: Path) -> dict:
    """The torch twin's `per_sample` (and a GPT's `analytic_per_sample`), counted as the torch
    runners count it (trainscale.runners.torch.flop_count.count); `method` says so. A
    catalogue model's count is kept in the file `kept`: the study's other runs read it."""

    def count() -> dict:
        from trainscale.runners.torch import flop_count

        block = flop_count.count(spec, shape, classes)
        return {**block, "method": f"torch twin: {block['method']}"}

    try:
        if spec.own_model is not None:  # the user's code: counted as it is now
            return count()
        key = f"{spec.model}:{list(shape)}:{classes}:{spec.activation_checkpointing}"
        counter = sources_version("trainscale.runners.torch.flop_count")  # an edit counts again
        return flops.kept(kept, f"{key}:{counter}", count)
    except ImportError as e:  # no torch in this environment
        why = f"not counted: the torch twin cannot be imported here ({e})"
        return {"per_sample": None, "method": why}


def _torch_gemm(precision: str, threads: int) -> float:
    from trainscale.runners.torch import flop_count

    return flop_count.cpu_gemm(precision, threads)


def _cpu_gemm(spec: RunSpec) -> tuple[str, object]:
    """The key and the timing function of a CPU's peak at the run's threads per worker: the
    torch runs' own (the same key and GEMM, so every framework's MFU on this host has one
    denominator; torch imported only where the peak is not kept yet) where torch is
    installed, else TensorFlow's matrix multiply at the process's threads, scaled to
    threads_per_worker."""
    name, threads = metrics.cpu_name(), spec.threads_per_worker
    if importlib.util.find_spec("torch") is None:
        process = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
        key = f"cpu:{name}:{spec.precision}:threads={threads}:tf"
        return key, lambda: _tf_gemm(spec) * threads / process
    return flops.cpu_key(name, spec.precision, threads), lambda: _torch_gemm(
        spec.precision, threads
    )


def _tf_gemm(spec: RunSpec) -> float:
    side = flops.GEMM_SIDE
    a = tf.cast(tf.random.normal((side, side), dtype=tf.float32), TF_DTYPES[spec.precision])
    matmul = tf.function(lambda: tf.matmul(a, a))
    return flops.gemm_flops_per_second(lambda: matmul().numpy(), side, lambda: None)


def counted(spec: RunSpec, shape: tuple[int, ...], classes: int, gpu_name: str | None,
            out: str | Path, devices: int) -> dict:  # fmt: skip
    """The runner's part of the `flops` block: the twin's count and the devices' peak (on CPU
    a worker's threads are its device: the peak at threads_per_worker × the workers)."""
    name = gpu_name or metrics.cpu_name()
    if gpu_name:
        key, gemm = f"cuda:{name}:{spec.precision}:tf", lambda: _tf_gemm(spec)
    else:
        key, gemm = _cpu_gemm(spec)
    kept = flops.peaks_dir(spec.path, out)
    peak, source = flops.peak(gpu_name, spec.precision, key, kept, metrics.hostname(), gemm)
    return {
        **_twin_count(spec, shape, classes, kept / "twin-counts.json"),
        "peak_per_second": peak * devices,
        "peak_source": source,
        "peak_device": name,
    }

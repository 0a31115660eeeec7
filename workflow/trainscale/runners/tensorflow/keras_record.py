"""The metrics record of a Keras run (keras_loop.py), written by the worker that ends as rank 0:
its epochs, and every worker's gathered peaks, utilisation, energy and host, combined as every
framework's loop combines them (the torch loop's `report`), so the families' records compare.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale.measure import metrics  # noqa: E402
from trainscale.measure.memory import memory_block  # noqa: E402
from trainscale.models import keras_models  # noqa: E402
from trainscale.plan.runspec import RunSpec  # noqa: E402
from trainscale.runners.common import check_oversubscribed  # noqa: E402
from trainscale.runners.tensorflow import keras_flops  # noqa: E402

if TYPE_CHECKING:
    from trainscale.runners.guarded import Parts
    from trainscale.runners.tensorflow.keras_strategy import KerasStrategy, Placement


@dataclass(frozen=True)
class Measured:
    """What the record says of the devices that trained, from the figures gathered on rank 0
    (a plug-in's `measured`)."""

    device: dict  # the `device` block: kind, name, count, logical, utilisation, energy
    memory: dict  # the `memory` block
    env: dict  # entries added to the `env` block
    gpu_name: str | None  # the GPU whose peak the FLOP count reads; None: the CPU's
    oversubscribed: bool  # this node's processes ask for more threads than it has cores


def record(
    plugin: KerasStrategy, p: Placement, rec, model, gathered, test, counts: tuple,
    parts: Parts, extra: dict,
) -> dict:  # fmt: skip
    """The metrics record from rank 0's epochs and the plug-in's `measured` figures; `counts`
    is (data set info, the record's path, train samples, test samples). `gathered` is None
    where the gather failed, `extra` the strategy's own blocks; the FLOP count is a part that
    may fail too (runners.guarded)."""
    spec = plugin.spec
    info, out, train_samples, test_samples = counts
    hosts = [h for _, h in gathered] if gathered is not None else [metrics.hostname()]
    frameworks = {"tensorflow": tf.__version__, "tf-keras": keras.__version__}
    env = metrics.environment(rec.start_utc, {**frameworks, **plugin.frameworks}, hosts)
    seen = plugin.measured(p, gathered)
    env.update(seen.env)
    counted = parts.run(
        "flops",
        lambda: keras_flops.counted(
            spec, info.shape, info.num_classes, seen.gpu_name, out, seen.device["count"]
        ),
        collective=False,
    )
    return rec.record(
        flops=counted,
        model={"params": keras_models.param_count(model)},
        data={"train_samples": train_samples, "test_samples": test_samples},
        test=dict(test),
        memory=seen.memory,
        device=seen.device,
        env=env,
        oversubscribed=seen.oversubscribed,
        launch=metrics.launch_info(),
        **extra,
    )


def measured(spec: RunSpec, p: Placement, gathered: list | None) -> Measured:
    """Every worker trained and measured itself: peak memory the max over workers (and each
    one's, in rank order), energy summed, utilisation averaged, each worker's CPUs."""
    env: dict = {}
    if gathered is not None:  # each worker's CPUs, the row's last figure
        env["rank_cpus"] = [int(row[6]) for row, _ in gathered]
    if p.gpu:
        env["cuda"] = tf.sysconfig.get_build_info().get("cuda_version")
        env["driver"] = metrics.driver_version()
        details = tf.config.experimental.get_device_details(tf.config.get_visible_devices("GPU")[0])
        name = details.get("device_name", "GPU")
    else:
        name = metrics.cpu_name()
        if p.logical:  # so that every table showing the device says what it was
            name += f" (as {p.replicas} logical devices)"
    devices = len(gathered) * p.replicas if gathered is not None else spec.world_size
    return Measured(
        device={
            "kind": "cuda" if p.gpu else "cpu",
            "name": name,
            "count": devices,
            "logical": p.logical,
            **usage_of(gathered),
        },
        memory=memory_of(gathered, p.gpu),
        env=env,
        gpu_name=name if p.gpu else None,
        oversubscribed=check_oversubscribed(
            spec.workers, spec.threads_per_worker + spec.loader_workers
        ),
    )


def memory_of(gathered: list | None, gpu: bool) -> dict:
    """The `memory` block from every worker's gathered peaks (nulls where the gather failed)."""
    if gathered is None:
        return {"peak_host_rss_bytes": None, "peak_device_bytes": None}
    rows = [r for r, _ in gathered]
    return {
        **memory_block([max(r[i] for r in rows) for i in range(4)], gpu),
        "per_rank_host_rss_bytes": [int(r[0]) for r in rows],
        "per_rank_device_bytes": [int(r[1]) for r in rows] if gpu else None,
    }


def usage_of(gathered: list | None) -> dict:
    """Utilisation averaged and energy summed over the workers that measured them."""
    rows = [r for r, _ in gathered or []]
    utils = [r[4] for r in rows if r[4] is not None]
    energies = [r[5] for r in rows if r[5] is not None]
    return {
        "utilization_mean": sum(utils) / len(utils) if utils else None,
        "energy_joules": sum(energies) if energies else None,
    }

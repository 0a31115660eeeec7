"""The metrics record of a Keras run (keras_loop.py), written by the worker that ends as rank 0:
its epochs, and every worker's gathered peaks, utilisation, energy and host, combined as every
framework's loop combines them (the torch loop's `report`), so the families' records compare.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale.measure import metrics  # noqa: E402
from trainscale.measure.memory import memory_block  # noqa: E402
from trainscale.models import keras_models  # noqa: E402
from trainscale.runners.common import check_oversubscribed  # noqa: E402
from trainscale.runners.tensorflow import keras_flops  # noqa: E402

if TYPE_CHECKING:
    from trainscale.runners.guarded import Parts
    from trainscale.runners.tensorflow.keras_loop import KerasStrategy, Placement


def record(
    plugin: KerasStrategy, p: Placement, rec, model, gathered, test, counts: tuple,
    parts: Parts, extra: dict,
) -> dict:  # fmt: skip
    """The metrics record from rank 0's epochs and every worker's gathered figures: peak memory
    the max over workers (and each one's, in rank order), energy summed, utilisation averaged;
    `counts` is (data set info, the record's path, train samples, test samples). `gathered` is
    None where the gather failed, `extra` the strategy's own blocks; the FLOP count is a part
    that may fail too (runners.guarded)."""
    spec = plugin.spec
    info, out, train_samples, test_samples = counts
    hosts = [h for _, h in gathered] if gathered is not None else [metrics.hostname()]
    frameworks = {"tensorflow": tf.__version__, "tf-keras": keras.__version__}
    env = metrics.environment(rec.start_utc, {**frameworks, **plugin.frameworks}, hosts)
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
    devices = len(hosts) * p.replicas if gathered is not None else spec.world_size
    counted = parts.run(
        "flops",
        lambda: keras_flops.counted(
            spec, info.shape, info.num_classes, name if p.gpu else None, out, devices
        ),
        collective=False,
    )
    return rec.record(
        flops=counted,
        model={"params": keras_models.param_count(model)},
        data={"train_samples": train_samples, "test_samples": test_samples},
        test=dict(test),
        memory=memory_of(gathered, p.gpu),
        device={
            "kind": "cuda" if p.gpu else "cpu",
            "name": name,
            "count": devices,
            "logical": p.logical,
            **usage_of(gathered),
        },
        env=env,
        oversubscribed=check_oversubscribed(
            spec.workers, spec.threads_per_worker + spec.loader_workers
        ),
        launch=metrics.launch_info(),
        **extra,
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

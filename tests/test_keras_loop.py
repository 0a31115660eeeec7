"""The one Keras loop (runners/tensorflow/keras_loop.py) under each of its plug-ins: every
TensorFlow strategy writes the same metric keys, per-rank memory, utilisation and energy alike."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from trainscale.measure import metrics
from trainscale.measure.device_usage import CpuUsage, cpu_busy_percent
from trainscale.measure.divergence import Divergence
from trainscale.plan.matrix import build_runs

import tap
from conftest import base_config

#: (strategy, workers, worker processes) of the family
FAMILY = [
    ("tf", 1, 1),
    ("tf-mirrored", 2, 1),
    ("tf-multiworker", 2, 2),
    ("horovod-keras", 2, 2),
    ("horovod-keras-elastic", 2, 2),
]
#: record blocks a plug-in adds on top of the loop's (KerasStrategy.extra_metrics)
EXTRA = {"horovod-keras": {"horovod"}, "horovod-keras-elastic": {"horovod"}}


def keys(d: dict, prefix: str = "") -> set[str]:
    """Every key path of a record (`memory.peak_host_rss_bytes`), lists' items left out, and
    the names inside the spec, the framework versions, the variables the ranks saw (each
    launcher sets its own: HOROVOD_* under horovodrun) and the planner's prediction (absent
    where the run was launched outside a study, as the elastic runs are)."""
    out = set()
    for k, v in d.items():
        if prefix + k == "memory.predicted":
            continue
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("spec", "frameworks", "variables"):
            out |= keys(v, f"{prefix}{k}.")
    return out


def epoch_end(per_step_losses: bool, fit_steps: int = 6):
    """(the loop's EpochEnd, its Recorder) of a one-worker `tf` run, for its divergence check
    alone: the parts of an epoch's end that the check does not read are left out."""
    from trainscale.runners.tensorflow import keras_loop, tf

    spec = build_runs(base_config(strategy=["tf"]), accelerator="cpu")[0][0]
    rec = metrics.Recorder(spec.to_dict())
    unread = (None,) * 5  # the model, the input, the data wait, the memory, the parts
    placement = keras_loop.Placement(rank=0, gpu=False)
    end = keras_loop.EpochEnd(
        tf.OneDevice(spec), placement, rec, *unread, {}, fit_steps, per_step_losses
    )
    return end, rec


def test_a_loss_is_judged_against_the_runs_first_loss_not_its_epochs():
    """Adam at lr 1e6 keeps the loss finite near 1e21 from its second step on: an epoch that
    starts there is caught against the run's first loss (its own first would be 1e21 too),
    and the last sound loss is the epoch before's."""
    end, rec = epoch_end(per_step_losses=True)
    assert not end.diverged(1, [2.3, 2.2])
    assert end.diverged(2, [1e21, 1e21])
    assert rec.losses.diverged == Divergence(2, 1, 1e21, 2.2)


def test_a_clock_of_epoch_means_puts_a_divergence_at_the_epochs_last_step():
    """tf-ps's clock knows each epoch's mean loss only (keras_clock.ScheduledEpochClock)."""
    end, rec = epoch_end(per_step_losses=False, fit_steps=6)
    assert not end.diverged(1, [2.3])
    assert end.diverged(2, [math.nan])
    d = rec.losses.diverged
    assert (d.epoch, d.step, d.last_sound) == (2, 6, 2.3) and math.isnan(d.loss)


def test_busy_percent_is_the_share_of_the_thread_budget():
    assert cpu_busy_percent(3.0, 2.0, 2) == 75.0
    assert cpu_busy_percent(9.0, 2.0, 2) == 100.0  # more threads than its budget: the unit is full
    assert cpu_busy_percent(1.0, 0.0, 1) is None
    # spans add up, and a sleeping process is idle while a computing one is not (how busy the
    # computing one looks depends on what else this machine runs, so no absolute bar)
    idle = CpuUsage(threads=1, reads_energy=False)
    for _ in range(2):
        idle.span_starts()
        time.sleep(0.1)
        idle.span_ends()
    assert idle.wall >= 0.2 and idle.result()[0] < 20
    busy = CpuUsage(threads=1, reads_energy=False)
    busy.span_starts()
    t0 = time.process_time()
    sum(i * i for i in range(2_000_000))  # one busy thread
    cpu = time.process_time() - t0
    busy.span_ends()
    assert busy.cpu >= cpu and busy.result()[0] == cpu_busy_percent(busy.cpu, busy.wall, 1)
    assert busy.result()[0] > idle.result()[0]


@pytest.fixture(scope="module")
def family(tf_study, horovod_study, elastic_keras_fixed) -> dict[str, dict]:
    """A record of each strategy, from the session's studies: tf, tf-mirrored and
    tf-multiworker from the TF study (3 epochs), horovod-keras from the Horovod study and
    horovod-keras-elastic's 2-worker run (2 epochs each): no run of their own."""
    recs = {s: tf_study[s] for s in ("tf", "tf-mirrored", "tf-multiworker")}
    recs["horovod-keras"] = horovod_study["recs"]["horovod-keras"][0]
    recs["horovod-keras-elastic"] = elastic_keras_fixed[2]
    for strategy, workers, _ in FAMILY:
        assert recs[strategy]["status"] == "ok", recs[strategy]["error"]
        assert recs[strategy]["spec"]["workers"] == workers, strategy
    return recs


@pytest.mark.slow
def test_every_keras_runner_writes_the_same_metric_keys(family):
    """One loop, one record: the same keys in every run of the family (a one-worker run has no
    `communication` block, and a plug-in's own blocks are named in EXTRA)."""
    full = keys(family["tf-multiworker"])
    for strategy, rec in family.items():
        extra = EXTRA.get(strategy, set())
        assert extra <= set(rec), strategy
        got = {k for k in keys(rec) if k.split(".")[0] not in extra}
        want = (
            full
            if rec["spec"]["world_size"] > 1
            else {k for k in full if not k.startswith("communication")}
        )
        assert got == want, (strategy, got ^ want)
        epoch_keys = [set(e) for e in rec["epochs"]]
        assert epoch_keys == [set(family["tf"]["epochs"][0])] * len(rec["epochs"]), strategy


@pytest.mark.slow
def test_every_keras_runner_records_per_rank_memory_utilisation_and_step_p95(family):
    for strategy, _, processes in FAMILY:
        rec = family[strategy]
        mem, dev = rec["memory"], rec["device"]
        per_rank = mem["per_rank_host_rss_bytes"]
        assert len(per_rank) == processes and all(v > 100 * 2**20 for v in per_rank), strategy
        assert max(per_rank) == mem["peak_host_rss_bytes"]
        assert mem["per_rank_device_bytes"] is None  # CPU
        # the worker processes' busy share of their CPU cores (trainscale.measure.device_usage)
        assert 0 < dev["utilization_mean"] <= 100, (strategy, dev)
        assert "energy_joules" in dev and dev["energy_joules"] is None  # no sensor on CPU
        assert dev["count"] == rec["spec"]["world_size"]
        for e in rec["epochs"]:
            assert 0 < e["step_seconds_p50"] <= e["step_seconds_p95"], (strategy, e)
        # the confusion of the evaluation counts every test sample once, whoever scored it
        test = rec["test"]
        confusion = test["confusion"]
        assert sum(map(sum, confusion)) == rec["data"]["test_samples"], strategy
        assert sum(confusion[k][k] for k in range(10)) / 360 == test["accuracy"], strategy
        assert len(test["per_class_accuracy"]) == 10, strategy
        assert len(rec["env"]["rank_hosts"]) == processes


def fed_run(
    tf_study: dict, horovod_study: dict, elastic_keras_runs: dict, strategy: str, workers: int
) -> tuple[dict, Path]:
    """(record, the test plug-in's files) of the session's Keras-loop run of `strategy` at
    `workers`, from the study that ran it with the plug-in: no run of its own."""
    if strategy.startswith("tf"):
        return tf_study[strategy], tf_study["_dir"]["tap"]
    if strategy == "horovod-keras":
        return horovod_study["recs"][strategy][0], horovod_study["tap"]
    return elastic_keras_runs[workers]


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, workers",
    [*((s, w) for s, w, _ in FAMILY), ("horovod-keras-elastic", 1)],
)
def test_every_keras_strategy_records_the_samples_its_workers_fed(
    tf_study, horovod_study, elastic_keras_runs, strategy, workers
):
    """Each epoch's recorded samples are the rows the model's train_step got in that epoch,
    over every replica and worker, each a per-worker batch (tap.assert_recorded_samples_were_fed;
    tf-ps: tests/test_tf_ps.py and tests/test_seeds.py). Under ParameterServerStrategy the
    two disagreed by 2× until the tf-ps fix: a check here makes any strategy's drift fail.
    The studies are named here, not fetched by name, so that xdist_groups puts this test in
    their group: fetched, they were built again on the other worker."""
    rec, taps = fed_run(tf_study, horovod_study, elastic_keras_runs, strategy, workers)
    assert rec["status"] == "ok", rec["error"]
    assert rec["spec"]["workers"] == workers
    tap.assert_recorded_samples_were_fed(rec, taps)

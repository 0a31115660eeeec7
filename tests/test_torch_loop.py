"""The one PyTorch loop (trainscale/runners/torch/torch_loop.py): every runner of the family writes
the same metric keys, and the CPU figures of `device` (trainscale/measure/device_usage.py) are
measured."""

import itertools
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from test_runners import make

from trainscale.measure import metrics
from trainscale.measure.device_usage import CpuUsage, RaplPackages, cpu_busy_percent

from conftest import NAMED_BY_THE_RUN, launch

#: every PyTorch-family strategy, with the workers it runs here (torch-dp: one CPU device)
FAMILY = {
    "torch": 1,
    "torch-dp": 1,
    "torch-ddp": 2,
    "torch-fsdp": 2,
    "torch-pipeline": 2,
    "deepspeed-zero0": 2,
    "deepspeed-zero3": 2,
    "horovod-torch": 2,
    "horovod-torch-elastic": 2,
}

#: the keys a plug-in adds on top of the loop's record (its own block, its framework's version)
PLUGIN_KEYS = {
    "torch-pipeline": {"pipeline"},
    "deepspeed": {"deepspeed", "env.frameworks.deepspeed", "memory.zero_estimate_bytes"},
    "horovod": {"horovod", "env.frameworks.horovod"},
}

#: blocks whose inner keys are the strategy's own configuration, not figures
OPAQUE = ("spec", "pipeline", "deepspeed", "horovod", "communication")


def keys(rec: dict, prefix: str = "") -> set[str]:
    """The record's keys as dotted paths, down into every block but the opaque ones; not the
    planner's memory prediction, which the launcher adds where the study asked for one."""
    out = set()
    for k, v in rec.items():
        if prefix + k == "memory.predicted":
            continue
        out.add(prefix + k)
        opaque = (prefix == "" and k in OPAQUE) or prefix + k in NAMED_BY_THE_RUN
        if isinstance(v, dict) and not opaque:
            out |= keys(v, f"{prefix}{k}.")
    return out


def own_keys(strategy: str) -> set[str]:
    family = strategy.split("-")[0]
    return PLUGIN_KEYS.get(strategy, PLUGIN_KEYS.get(family, set()))


def studied(*records: Iterable[tuple[dict, Path]]) -> dict[str, dict]:
    """The family's records among the shared studies' (conftest: (record, path) pairs), each of
    the strategy at the workers FAMILY gives it (the ZeRO study's at fp32 or bf16: its one run
    of each stage)."""
    recs = {}
    for rec, _ in itertools.chain(*records):
        spec = rec["spec"]
        if FAMILY.get(spec["strategy"]) == spec["workers"]:
            recs[spec["strategy"]] = rec
    return recs


@pytest.mark.slow
def test_every_runner_of_the_family_writes_the_same_keys(
    tmp_path, torch_study, deepspeed_study, horovod_study, parallel_study
):
    """A run of each PyTorch-family strategy: the same keys, the plug-in's own blocks aside,
    and in each the figures the loop owns: every rank's peak RSS, the measured utilisation, the
    energy key (null without a sensor) and each epoch's p95. All but torch-dp come from the
    shared studies' runs (conftest); torch-dp, in none of them, is a short run (3 steps per
    epoch)."""
    recs = studied(
        torch_study["recs"],
        deepspeed_study["recs"],
        horovod_study["recs"].values(),
        parallel_study["recs"],
    )
    assert sorted(recs) == sorted(set(FAMILY) - {"torch-dp"})
    for strategy, workers in FAMILY.items():
        if strategy in recs:
            continue
        spec = make(strategy, workers, steps_per_epoch=3)
        out = tmp_path / strategy / "metrics.json"
        p = launch(spec, out, timeout=300)
        assert p.returncode == 0, (strategy, p.stdout[-3000:] + p.stderr[-3000:])
        rec = metrics.read(out)
        assert rec["status"] == "ok", (strategy, rec["error"])
        recs[strategy] = rec
    loop_keys = keys(recs["torch-ddp"])
    for strategy, rec in recs.items():
        # a one-worker run has no `communication` block: nothing to communicate (metrics.py)
        want = loop_keys if FAMILY[strategy] > 1 else loop_keys - {"communication"}
        assert keys(rec) - own_keys(strategy) == want, strategy
        per_rank = rec["memory"]["per_rank_host_rss_bytes"]
        assert len(per_rank) == FAMILY[strategy] and min(per_rank) > 50 * 2**20, strategy
        assert rec["memory"]["peak_host_rss_bytes"] == max(per_rank), strategy
        assert 0 < rec["device"]["utilization_mean"] <= 100, strategy
        assert "energy_joules" in rec["device"], strategy
        assert all(e["step_seconds_p95"] > 0 for e in rec["epochs"]), strategy
        # config optimizer.fused auto: on CPU, torch's loop over the tensors (torch_parts)
        assert rec["optimizer"] == {"implementation": "for-loop"}, strategy
        # per-class accuracy from the evaluation's confusion matrix (trainscale.measure.classes)
        test = rec["test"]
        assert sum(map(sum, test["confusion"])) == rec["data"]["test_samples"], strategy
        assert len(test["per_class_accuracy"]) == 10, strategy
        assert test["class_names"] == [str(k) for k in range(10)], strategy
        # MFU (trainscale.measure.flops): counted FLOPs × throughput over a measured CPU peak
        f = rec["flops"]
        assert f["per_sample"] > 0 and f["method"] == "flop_counter", strategy
        assert f["achieved_per_second"] == pytest.approx(f["per_sample"] * rec["throughput"])
        assert f["peak_source"] == "measured" and 0 < f["mfu"] <= 1, strategy


def test_cpu_busy_share_is_cpu_time_over_wall_time_and_threads():
    assert cpu_busy_percent(1.5, 2.0, 1) == pytest.approx(75.0)
    assert cpu_busy_percent(1.5, 1.0, 2) == pytest.approx(75.0)
    assert cpu_busy_percent(3.0, 1.0, 2) == 100.0  # helper threads past the budget: capped
    assert cpu_busy_percent(1.0, 0.0, 1) is None
    usage = CpuUsage(threads=1, reads_energy=False)
    usage.span_starts()
    time.sleep(0.3)  # idle: next to no CPU time
    usage.span_ends()
    idle, energy = usage.result()
    assert idle < 20 and energy is None
    usage.span_starts()
    t = time.perf_counter()
    while time.perf_counter() - t < 0.3:  # busy on one thread
        pass
    usage.span_ends()
    both, _ = usage.result()  # over both spans: about half of them busy
    assert idle < both < 80 and usage.wall == pytest.approx(0.6, abs=0.1)


def test_rapl_energy_counts_across_the_counters_wrap(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("900000\n")
    core = tmp_path / "intel-rapl:0:0"  # a sub-zone: counted in its package already
    core.mkdir()
    (core / "max_energy_range_uj").write_text("1000000\n")
    (core / "energy_uj").write_text("5\n")
    rapl = RaplPackages(str(tmp_path / "intel-rapl:[0-9]*"))
    before = rapl.read()
    (zone / "energy_uj").write_text("100000\n")  # wrapped past 1 J
    assert rapl.joules(before, rapl.read()) == pytest.approx(0.2)
    assert RaplPackages(str(tmp_path / "nothing-*")).read() is None

"""torch-fsdp (FSDP2) and torch-pipeline (torch.distributed.pipelining): matrix rules, the
stage split, and real 2-rank runs over gloo checked against DDP and a single process."""

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from test_collectives import check_busbw_from_raw_timings
from torch.utils.data.distributed import DistributedSampler

from trainscale import data
from trainscale.launch.supervise import Environment, command
from trainscale.measure import metrics
from trainscale.models import torch_models as models
from trainscale.plan import catalog
from trainscale.plan.matrix import build_runs
from trainscale.runners.torch.pipeline import split
from trainscale.runners.torch.torch_parts import make_optimizer, to_tensors

import tap
from conftest import launch, validated


def runs_of(strategy, workers=2, batch=64, precision="fp32", model="seed-small", **kw):
    m = {
        "strategy": [strategy],
        "model": [model],
        "dataset": ["digits"],
        "workers": [workers],
        "batch_size": [batch],
        "precision": [precision],
    }
    return build_runs(validated({"study": "t", "matrix": m, **kw}))


def make(*args, **kw):
    runs, dropped = runs_of(*args, **kw)
    assert runs, dropped
    return runs[0]


def test_model_blocks_table_matches_the_models():
    shape = data.info("synthetic-imagenet").shape
    for name in models.MODELS:
        row = catalog.MODELS[name]
        with torch.device("meta"):  # a token model at its own context and vocabulary
            net = models.build(name, *((shape, 10) if row.input == "image" else
                                       (row.published_input, row.published_classes)))  # fmt: skip
        assert catalog.MODELS[name].blocks == len(models.blocks(net)), name


def test_split_is_contiguous_and_minimises_the_largest_stage():
    sizes = [5, 1, 1, 8, 2, 2, 9, 3]
    for stages in range(1, len(sizes) + 1):
        bounds = split(sizes, stages)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(sizes) and len(bounds) == stages
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(bounds))
        worst = max(sum(sizes[lo:hi]) for lo, hi in bounds)
        brute = min(  # every way of placing stages − 1 cuts
            max(sum(sizes[a:b]) for a, b in itertools.pairwise((0, *cuts, len(sizes))))
            for cuts in itertools.combinations(range(1, len(sizes)), stages - 1)
        )
        assert worst == brute, stages
    with pytest.raises(ValueError, match="cannot cut 3 blocks into 4"):
        split([1, 2, 3], 4)


def test_pipeline_cells_that_cannot_split_are_dropped_with_the_reason():
    s = make("torch-pipeline", workers=2, microbatches=4, pipeline_schedule="1f1b")
    assert (s.global_batch_size, s.per_worker_batch_size) == (64, 64)  # every stage: whole batch
    assert (s.microbatches, s.pipeline_schedule) == (4, "1f1b")
    assert make("torch-ddp").microbatches == 1 and make("torch-ddp").pipeline_schedule is None
    cases = {
        "has 3 blocks, too few for 4 pipeline stages": dict(workers=4),
        "microbatches 5 do not divide the batch of 64": dict(microbatches=5),
        "1F1B needs microbatches (2) ≥ stages (3)": dict(
            workers=3, batch=66, microbatches=2, pipeline_schedule="1f1b"
        ),
        "fp16 needs a loss scaler": dict(precision="fp16"),
        "BatchNorm: needs micro-batches of at least 2": dict(
            model="resnet50", batch=4, microbatches=4, workers=1
        ),
    }
    for reason, kw in cases.items():
        workers = kw.pop("workers", 2)
        cfg = {
            "strategy": ["torch-pipeline", "torch"],
            "model": [kw.pop("model", "seed-small")],
            "dataset": ["synthetic-imagenet" if reason.startswith("BatchNorm") else "digits"],
            "workers": [workers, 1] if workers != 1 else [1],
            "batch_size": [kw.pop("batch", 64)],
            "precision": [kw.pop("precision", "fp32")],
            "exclude": [{"strategy": "torch-pipeline", "workers": 1}] if workers != 1 else [],
        }
        runs, dropped = build_runs(validated({"study": "t", "matrix": cfg, **kw}))
        pipe = [d for d in dropped if d.values["strategy"] == "torch-pipeline"]
        assert [r.strategy for r in runs] == ["torch"], reason
        assert any(reason in d.reason for d in pipe), (reason, [d.reason for d in pipe])


def test_both_launch_through_torchrun():
    env = Environment(mode="local", python="py")
    for strategy in ("torch-fsdp", "torch-pipeline"):
        argv = command(make(strategy), env, "m.json")
        assert "torch.distributed.run" in argv and "--nproc-per-node=2" in argv


#: FSDP against its reference: FSDP reduce-scatters the gradient (a sum over 2 ranks, then ÷ 2)
#: where DDP all-reduces and one process averages 64 samples: equal up to float32 rounding.
#: Measured largest difference after 44 steps: 3e-8 against one process (SGD), 0 against DDP
#: (Adam); rtol 1e-4 / atol 1e-5 allow ~300× that and stay far below a wrong update (SGD
#: without momentum: a summed gradient takes 2× steps, a difference of the order of the whole
#: training move, which is checked to be ≥ 0.02).
RTOL, ATOL = 1e-4, 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer, reference",
    [("sgd", "torch"), ("adam", "torch-ddp")],
    ids=["sgd-vs-one-process", "adam-vs-ddp"],
)
def test_fsdp_ends_with_the_references_weights_on_the_same_data_order(
    tmp_path, optimizer, reference
):
    """FSDP shards parameters, gradients and optimizer state; the optimisation is DDP's and one
    process's: the same weights from the same initial ones, after training moved them. With SGD
    (no momentum) a gradient summed over ranks instead of averaged would show; with Adam, the
    sharded optimizer state must still step like DDP's. FSDP's samples and throughput are
    checked against the batches its 2 ranks really fed."""
    opt = {"name": optimizer, "lr": 0.05 if optimizer == "sgd" else 0.001}
    weights, inits = {}, {}
    for strategy in (reference, "torch-fsdp"):
        out = tmp_path / strategy / "metrics.json"
        taps = tmp_path / f"{strategy}-tap"
        s = make(strategy, workers=1 if strategy == "torch" else 2, optimizer=opt)
        assert s.global_batch_size == 64
        p = launch(s, out, **tap.env(taps))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rec = metrics.read(out)
        assert rec["status"] == "ok", rec["error"]
        if strategy == "torch-fsdp":
            assert len(rec["memory"]["per_rank_host_rss_bytes"]) == 2
            assert rec["memory"]["peak_host_rss_bytes"] == max(
                rec["memory"]["per_rank_host_rss_bytes"]
            )
            tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step=2)
        weights[strategy] = tap.final_weights(taps, strategy)
        inits[strategy] = tap.initial_weights(taps)
    ref, fsdp = weights[reference], weights["torch-fsdp"]
    assert ref.keys() == fsdp.keys() == inits["torch-fsdp"].keys()
    for k in ref:
        np.testing.assert_array_equal(inits["torch-fsdp"][k], inits[reference][k], err_msg=k)
    tap.assert_moved(inits[reference], ref, reference)
    for k in ref:
        assert fsdp[k].shape == ref[k].shape  # full (unsharded) tensors
        np.testing.assert_allclose(fsdp[k], ref[k], rtol=RTOL, atol=ATOL, err_msg=k)


def single_process_losses(spec) -> list[float]:
    """One process, the same model, data order and optimizer, each batch split into the same
    micro-batches with gradients averaged over them: the losses the pipeline must reproduce."""
    torch.set_num_threads(1)
    arrays = data.load(spec.dataset, spec.data_dir, seed=spec.seed)
    x, y, _, _ = to_tensors(arrays, torch.device("cpu"))
    torch.manual_seed(spec.seed)
    net = models.build(spec.model, arrays.info.shape, arrays.info.num_classes)
    opt = make_optimizer(spec, net.parameters())
    n, b, m = len(y), spec.global_batch_size, spec.microbatches
    sampler = DistributedSampler(range(n * spec.scale), num_replicas=1, rank=0, seed=spec.seed)
    losses = []
    for epoch in range(1, spec.epochs + 1):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler)) % n
        for step in range(len(order) // b):
            opt.zero_grad()
            for idx in order[step * b : (step + 1) * b].chunk(m):
                loss = F.cross_entropy(net(x[idx]), y[idx])
                (loss / m).backward()
                losses.append(loss.item())
            opt.step()
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_micro_batch_losses_match_one_process(tmp_path, schedule):
    spec = make("torch-pipeline", microbatches=4, pipeline_schedule=schedule)
    out, taps = tmp_path / "metrics.json", tmp_path / "tap"
    p = launch(spec, out, **tap.env(taps))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    pipe = rec["pipeline"]
    assert pipe["schedule"] == schedule and pipe["microbatch_size"] == 16
    assert pipe["stages"] == [[0, 2], [2, 3]]  # seed-small: conv+hidden | classifier
    assert sum(pipe["stage_params"]) == rec["model"]["params"]
    assert rec["test"]["accuracy"] > 0.5
    # every stage walks every batch; the loss (the tap's count) is fed on the last stage, once
    # per micro-batch: 4 feeds of 16 per step, and the record must count 64 per step, not 128
    tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step=4)
    got = tap.losses(taps)  # the last stage's, one per micro-batch
    want = single_process_losses(spec)
    assert len(got) == len(want) == 2 * 22 * 4  # epochs × steps × micro-batches
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst < 5e-5, f"largest difference {worst:.2e}: not equal to 4 decimals"


@pytest.mark.slow
def test_parallel_study_through_snakemake(parallel_study):
    """.test/parallel.yaml for real (conftest.parallel_study, whose records
    tests/test_torch_loop.py reads too): torch-fsdp and torch-pipeline beside torch-ddp on 2 CPU
    workers, the all-reduce benchmark for 2 workers, and the communication model (the figures
    and report.html are exercised from generated files in test_report.py)."""
    res = parallel_study["results"]
    recs = {}
    for rec, f in parallel_study["recs"]:
        assert rec["status"] == "ok", (f, rec["error"])
        recs[(rec["spec"]["strategy"], rec["spec"]["workers"])] = rec
    assert set(recs) == {
        ("torch-ddp", 1),
        ("torch-ddp", 2),
        ("torch-fsdp", 2),
        ("torch-pipeline", 2),
    }
    assert recs[("torch-pipeline", 2)]["pipeline"]["schedule"] == "gpipe"
    assert len(recs[("torch-fsdp", 2)]["memory"]["per_rank_host_rss_bytes"]) == 2
    bench = res / "collectives" / "backend~gloo" / "workers~2" / "nodes~1.json"
    rec = check_busbw_from_raw_timings(bench)
    assert rec["iters"] == 10 and rec["warmup"] == 3  # from the study's collectives key
    assert rec["max_bytes"] == recs[("torch-ddp", 2)]["model"]["params"] * 4
    comm = pd.read_csv(res / "communication.csv")
    assert sorted(comm["strategy"]) == ["torch-ddp", "torch-fsdp"]  # DDP family, N > 1
    assert (comm["predicted_comm_seconds"] > 0).all() and (comm["comm_share"] > 0).all()
    ddp = comm[comm["strategy"] == "torch-ddp"].iloc[0]
    assert 0 < ddp["network_bound_efficiency"] < 1  # torch-ddp has its N = 1 baseline

"""The prediction model (trainscale/analysis/predict.py): parameters recovered from runs generated
with known ones, a prediction computed by hand, bands that hold held-out measurements, predictions
kept out of the measured tables, and the exposed-communication block of the runners."""

import math

import numpy as np
import pandas as pd
import pytest

from trainscale.analysis import aggregate, predict, predict_network
from trainscale.measure import collectives

ALPHA, BW = 20e-6, 1e9  # the generated network: 20 µs per ring step, 1 GB/s per link
PARAMS = 250_000  # S = 1 MB of fp32 gradient


def ring(n: int, size: float) -> float:
    return 2 * (n - 1) * ALPHA + collectives.bus_factor(n) * size / BW


def benchmark(n: int = 2) -> pd.DataFrame:
    """collectives.csv of an n-worker benchmark of the generated network."""
    sizes = [2**k for k in range(10, 21)]
    t = [ring(n, s) for s in sizes]
    return pd.DataFrame(
        {
            "status": "ok",
            "error": None,
            "backend": "gloo",
            "workers": n,
            "nodes": 1,
            "world_size": n,
            "bytes": sizes,
            "p50_seconds": t,
            "p95_seconds": t,
        }
    )


def runs_from_model(
    c0, c1, t_fixed, overlap, sizes, batch=256, repeats=1, noise=0.0, seed=0, strategy="torch-ddp"
) -> pd.DataFrame:
    """runs.csv rows of a study whose step times follow the model exactly (times (1 + noise·z))."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        b = batch // n
        steps = (batch * 40 // n) // b
        for r in range(repeats):
            z = 1 + noise * rng.standard_normal()
            compute = (c0 + c1 * b) * z
            t = compute + (t_fixed + max(0.0, ring(n, PARAMS * 4) - overlap) if n > 1 else 0.0)
            rows.append(
                {
                    "run": f"{strategy}/{n}/{r}",
                    "status": "ok",
                    "spec.strategy": strategy,
                    "spec.model": "seed-small",
                    "spec.dataset": "digits",
                    "spec.scale": 1,
                    "spec.batch_size": batch,
                    "spec.batch_mode": "global",
                    "spec.precision": "fp32",
                    "spec.workers": n,
                    "spec.nodes": 1,
                    "spec.world_size": n,
                    "spec.per_worker_batch_size": b,
                    "spec.repeat": r,
                    "data.train_samples": batch * 40,
                    "model.params": PARAMS,
                    "steady_epoch_seconds": steps * t,
                    "throughput": batch / t,
                    "communication.compute_seconds_per_step": compute if n > 1 else np.nan,
                }
            )
    return pd.DataFrame(rows)


def test_fit_gives_back_the_parameters_the_metrics_were_made_with():
    truth = {"c0": 2e-3, "c1": 1e-4, "t_fixed": 5e-4, "overlap": 1.3e-3}
    runs = runs_from_model(**truth, sizes=[1, 2, 4, 8, 16], repeats=3, noise=0.003)
    obs = predict.observations(runs)
    net = predict_network.network(benchmark(), {"gpus_per_node": 16}, 16)
    f = predict.fit(obs, net)
    got = {"c0": f.c0, "c1": f.c1, "t_fixed": f.t_fixed, "overlap": f.overlap}
    for k, v in truth.items():
        assert got[k] == pytest.approx(v, rel=0.05), (k, got)


def test_one_prediction_computed_by_hand():
    """N = 1 (b 64, 10 ms) and N = 2 (b 32: 6 ms no-sync, 9 ms step); a described link of
    1 GB/s and 10 µs; predict N = 4 on one node."""
    runs = runs_from_model(1, 0, 0, 0, sizes=[1, 2], batch=64)
    runs["steady_epoch_seconds"] = [40 * 10e-3, 40 * 9e-3]  # 40 steps per epoch at both N
    runs["throughput"] = [6400.0, 64 / 9e-3]
    runs["communication.compute_seconds_per_step"] = [np.nan, 6e-3]
    cfg = {"world_sizes": [4], "gpus_per_node": 8, "network": {"link_gbps": 1, "latency_us": 10}}
    pred, check, _ = predict.predict_study(runs, aggregate.collectives_frame([]), cfg)
    # by hand: t_compute(b) = 2 ms + 0.125 ms · b (through (64, 10 ms) and (32, 6 ms));
    # t_comm(2) = 2·1·10 µs + 1·1 MB / 1 GB/s = 1.02 ms; exposed 3 ms > t_comm: overlap 0,
    # t_fixed = 3 − 1.02 = 1.98 ms; t_comm(4) = 6·10 µs + 1.5 ms = 1.56 ms;
    # t_step(4) = (2 + 2) + 1.98 + 1.56 = 7.54 ms; throughput 64 / 7.54 ms; E = X / (4 · 6400)
    row = pred[pred["world_size"] == 4].iloc[0]
    assert row["basis"] == "predicted" and row["nodes"] == 1
    assert row["throughput_pred"] == pytest.approx(64 / 7.54e-3, rel=1e-6)
    assert row["efficiency_pred"] == pytest.approx(64 / 7.54e-3 / (4 * 6400), rel=1e-6)
    assert row["throughput_lo"] <= row["throughput_pred"] <= row["throughput_hi"]
    assert "overlap = 0" in row["assumptions"] and "predict.network" in row["assumptions"]
    assert list(pred.columns) == predict.PREDICTION_COLUMNS
    assert set(pred[pred["world_size"] < 4]["basis"]) == {"measured"}
    # held out, N = 2 is predicted from N = 1 alone: compute ∝ batch, t_fixed = overlap = 0
    (c,) = check.itertuples(index=False)
    assert c.fitted_on == "1" and "proportional" in c.note
    assert c.predicted == pytest.approx(64 / (5e-3 + 1.02e-3), rel=1e-6)
    assert c.error_pct == pytest.approx(100 * (c.predicted - c.measured) / c.measured)


def test_bands_hold_most_held_out_measurements():
    """Leave-one-out over N = 2 … 32 of noisy generated studies (5 % noise, 3 repeats): the rate
    at which the held-out mean falls in the band is printed; it must be most of them."""
    net_cfg = {"gpus_per_node": 32}
    inside = total = 0
    errors = []
    for seed in range(4):
        runs = runs_from_model(
            2e-3, 1e-4, 5e-4, 1.3e-3, [1, 2, 4, 8, 16, 32], repeats=3, noise=0.05, seed=seed
        )
        _, check, _ = predict.predict_study(runs, benchmark(), net_cfg)
        inside += int(check["in_band"].sum())
        total += len(check)
        errors += check["error_pct"].abs().tolist()
    print(f"held-out measurements inside the band: {inside} of {total}; "
          f"median |error| {np.median(errors):.1f} %")  # fmt: skip
    assert total == 4 * 5 and inside / total >= 0.75
    assert np.median(errors) < 10


def test_predictions_cover_every_world_size_with_bands_and_stay_out_of_the_tables():
    runs = runs_from_model(2e-3, 1e-4, 5e-4, 1.3e-3, [1, 2], batch=64, repeats=2, noise=0.05)
    cfg = {"world_sizes": [4, 8, 16, 32, 64]}
    pred, check, _ = predict.predict_study(runs, benchmark(), cfg)
    p = pred[pred["basis"] == "predicted"]
    assert sorted(p["world_size"]) == [4, 8, 16, 32, 64]
    assert (p["throughput_lo"] <= p["throughput_pred"]).all()
    assert (p["throughput_pred"] <= p["throughput_hi"]).all()
    assert "links between nodes assumed as fast as inside one" in p["assumptions"].iloc[-1]
    assert {"error_pct", "in_band", "measured", "predicted"} <= set(check.columns)
    scaling = aggregate.scaling_frame(runs.assign(oversubscribed=False, first_epoch_seconds=1.0))
    assert sorted(scaling["world_size"]) == [1, 2]  # the measured tables know no prediction


def test_logical_device_cells_are_never_ranked_fastest():
    cells = pd.DataFrame(
        {
            "model": "m", "dataset": "d", "world_size": 2, "strategy": ["tf-mirrored", "torch-ddp"],
            "scale": 1, "batch_size": 64, "batch_mode": "global", "workers": 2, "nodes": 1,
            "precision": "fp32", "throughput_mean": [900.0, 500.0], "throughput_ci95": np.nan,
            "speedup": 1.0, "efficiency": 0.5, "efficiency_kind": "strong",
            "speedup_vs_single": 1.0, "baseline_note": "", "oversubscribed": False,
            "logical": [True, False], "ok": 1, "runs": 1,
        }
    )  # fmt: skip
    (win,) = aggregate.fastest(cells).itertuples(index=False)
    assert win.strategy == "torch-ddp"


def test_bad_network_and_card_are_named():
    with pytest.raises(ValueError, match="link_gbps"):
        predict_network.described_link({"latency_us": 3}, "predict.network")
    with pytest.raises(ValueError, match="predict.card: /nonexistent.json does not exist"):
        predict_network.network(aggregate.collectives_frame([]), {"card": "/nonexistent.json"}, 2)


def test_exposed_block_and_replica_keep_the_weights():
    """runners/torch/exposed.py: the replica's steps are timed, the exposed time is step − compute
    (never below 0), and the model and optimizer end as they began."""
    torch = pytest.importorskip("torch")
    from trainscale.runners.torch import exposed

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 4, (64,))
    before = [p.detach().clone() for p in net.parameters()]
    epochs = [{"step_seconds_p50": 9.0}, {"step_seconds_p50": 1.0}, {"step_seconds_p50": 3.0}]
    batches = exposed.batches_of(x, y, torch.randperm(64), 16)
    block = exposed.measure_exposed_communication(
        "replica", epochs, net, opt, batches, torch.device("cpu"), grad_accum=2
    )
    # the steady epochs' steps (none given here): the fewest no-sync steps
    assert block["method"] == "local-replica" and block["steps"] == exposed.MIN_STEPS
    assert block["step_seconds_per_step"] == 2.0  # epochs 2.. only
    assert 0 < block["compute_seconds_per_step"] < 2.0
    assert math.isclose(block["exposed_seconds_per_step"], 2.0 - block["compute_seconds_per_step"])
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert exposed.no_sync_steps([{"steps": 50}, {"steps": 8}, {"steps": 8}]) == 16
    assert exposed.no_sync_steps([{"steps": 50}, {"steps": 30}]) == exposed.STEPS
    assert not opt.state
    slow = exposed.block(epochs[:2], 5.0, "ddp-no_sync")
    assert slow["exposed_seconds_per_step"] == 0.0


def test_runners_without_a_switch_record_null_with_the_reason():
    """A multi-worker TF run records `communication` with null figures and why; a one-worker
    run has no such block; both follow the metrics schema."""
    from test_aggregate import spec_for

    from trainscale.measure import metrics

    for strategy, workers in (("tf-multiworker", 2), ("torch", 1)):
        rec = metrics.Recorder(spec_for(strategy, workers).to_dict())
        rec.training_starts()
        for _ in range(2):
            rec.epoch(1.0, samples=64, steps=1, train_loss=1.0, step_seconds=[1.0])
        out = rec.record(model={"params": 10})
        metrics.validate(out)
        if workers == 1:
            assert "communication" not in out
        else:
            c = out["communication"]
            assert c["exposed_seconds_per_step"] is None and c["method"] is None
            assert "no switch" in c["note"]


def test_a_study_of_one_multi_worker_size_is_predicted_and_says_the_check_was_not_made():
    runs = runs_from_model(2e-3, 1e-4, 5e-4, 1.3e-3, [2], batch=64, repeats=2, noise=0.05)
    pred, check, _ = predict.predict_study(runs, benchmark(), {"world_sizes": [4, 8]})
    assert list(pred["basis"]) == ["measured", "predicted", "predicted"]
    assert pred["assumptions"].str.contains("model's N = 1 throughput").all()
    (c,) = check.itertuples(index=False)
    assert pd.isna(c.predicted) and "could not be made" in c.note


def test_another_clusters_scaling_card_gives_the_links_between_nodes(tmp_path):
    """predict.card: a trainscale scaling card (its collectives nest each benchmark's sizes)
    whose 2-node all-reduce stands for the inter-node links of this study's prediction."""
    import json

    sizes = [
        {"bytes": 2**k, "p50_seconds": 2**k / 1e8 + 50e-6, "busbw_bytes_per_second": 1e8}
        for k in range(10, 24)
    ]
    bench = {"backend": "nccl", "workers": 4, "nodes": 2, "world_size": 8, "device": "cuda"}
    card = {
        "schema": "trainscale.scaling-card/1",
        "collectives": [{**bench, "hosts": [], "sizes": sizes}],
    }
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    net = predict_network.network(aggregate.collectives_frame([]), {"card": str(path)}, 4)
    assert net.inter is not None and "scaling card" in net.inter.source
    assert net.inter.n_measured == 8 and net.inter.sizes[-1] == 2**23

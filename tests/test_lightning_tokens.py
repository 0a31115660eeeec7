"""`lightning-ddp` trains a GPT on token data: gpt-nano on the shipped byte corpus (shakespeare),
real short runs through the real launcher (torchrun, gloo) on CPU, at 1 and 2 workers. Its ranks
feed the torch loop's windows in the torch loop's order, disjoint across ranks, and it ends
each epoch where torch-ddp does."""

import math

import numpy as np
import pytest

from trainscale.data import tokens
from trainscale.measure import metrics
from trainscale.plan.matrix import build_runs

import tap
from conftest import launch, validated

pytestmark = pytest.mark.slow

SEQ_LEN, BATCH, STEPS, EPOCHS = 32, 4, 3, 2
#: test tokens each evaluation scores (config eval_tokens): 128 windows, not the whole split
EVAL_TOKENS = 4096


def token_spec(strategy: str, workers: int):
    """gpt-nano on shakespeare at seq_len 32, a global batch of 4, 3 steps × 2 epochs."""
    m = {"strategy": [strategy], "model": ["gpt-nano"], "dataset": ["shakespeare"],
         "seq_len": [SEQ_LEN], "batch_size": [BATCH], "workers": [workers]}  # fmt: skip
    cfg = {
        "study": "t",
        "matrix": m,
        "epochs": EPOCHS,
        "steps_per_epoch": STEPS,
        "eval_tokens": EVAL_TOKENS,
    }
    runs, dropped = build_runs(validated(cfg))
    assert len(runs) == 1, dropped
    return runs[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """trained(strategy, workers) -> (spec, record, tap dir): each run once per module."""
    done = {}

    def run(strategy: str, workers: int):
        if (strategy, workers) not in done:
            spec = token_spec(strategy, workers)
            where = tmp_path_factory.mktemp(f"{strategy}-{workers}")
            out, taps = where / "metrics.json", where / "tap"
            p = launch(spec, out, **tap.env(taps))
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
            rec = metrics.read(out)  # validated against the metrics schema
            assert rec["status"] == "ok", rec["error"]
            done[strategy, workers] = spec, rec, taps
        return done[strategy, workers]

    return run


def fed(taps, rank: int) -> list[list[int]]:
    """The next-token targets of every training batch rank `rank` fed, flattened, in order."""
    return [labels for r, _, labels in tap.labels(taps) if r == rank]


@pytest.mark.parametrize("workers", [1, 2])
def test_lightning_trains_gpt_nano_on_shakespeare(trained, workers):
    """A whole record of a GPT run: tokens/s, next-token accuracy, perplexity, FLOPs, and the
    sample counts in windows of seq_len ids."""
    spec, rec, _ = trained("lightning-ddp", workers)
    assert [e["steps"] for e in rec["epochs"]] == [STEPS] * EPOCHS
    assert rec["tokens_per_second"] > 0
    assert rec["tokens_per_second"] == pytest.approx(rec["throughput"] * SEQ_LEN)
    test = rec["test"]
    assert 0 <= test["accuracy"] <= 1
    assert test["perplexity"] >= 1
    assert test["perplexity"] == pytest.approx(math.exp(test["loss"]))
    assert rec["flops"]["per_sample"] > 0
    assert rec["flops"]["analytic_per_sample"] > 0
    train = tokens.TrainWindows(tokens.spec_ids(spec, "train"), SEQ_LEN, 1, 0, 1, spec.seed)
    evals = tokens.EvalWindows(tokens.spec_ids(spec, "test"), SEQ_LEN, 1, 0, 1, spec.eval_tokens)
    assert evals.windows == EVAL_TOKENS // SEQ_LEN  # config eval_tokens bounds the scoring
    assert rec["data"]["train_samples"] == train.count
    assert rec["data"]["test_samples"] == evals.windows
    assert rec["data"]["seq_len"] == SEQ_LEN and rec["data"]["vocab_size"] == 256
    assert rec["device"]["count"] == workers


def test_ranks_feed_torch_ddps_disjoint_windows_and_end_where_it_does(trained):
    """At 2 workers every rank feeds exactly the batches torch-ddp's rank feeds (the torch
    loop's windows, in its order), the two ranks' windows of an epoch are disjoint, and the
    epochs' training losses and the test scores are torch-ddp's."""
    spec, light, light_tap = trained("lightning-ddp", 2)
    _, ddp, ddp_tap = trained("torch-ddp", 2)
    ids, b = tokens.spec_ids(spec, "train"), spec.per_worker_batch_size
    count = tokens.window_count(len(ids), SEQ_LEN)
    for rank in (0, 1):
        assert len(fed(light_tap, rank)) == STEPS * EPOCHS
        assert fed(light_tap, rank) == fed(ddp_tap, rank)
    for epoch in range(1, EPOCHS + 1):
        mine = [tokens.rank_windows(count, r, 2, spec.seed, epoch)[: STEPS * b] for r in (0, 1)]
        assert not set(mine[0]) & set(mine[1])
        for rank in (0, 1):
            for step in range(STEPS):
                _, y = tokens.window_batch(ids, mine[rank][step * b : (step + 1) * b], SEQ_LEN)
                got = fed(light_tap, rank)[(epoch - 1) * STEPS + step]
                np.testing.assert_array_equal(got, y.ravel())
    losses = [e["train_loss"] for e in light["epochs"]]
    assert losses == pytest.approx([e["train_loss"] for e in ddp["epochs"]], rel=1e-5)
    for k in ("accuracy", "loss", "perplexity"):
        assert light["test"][k] == pytest.approx(ddp["test"][k], rel=1e-5), k

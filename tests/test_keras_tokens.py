"""The TensorFlow family on token data (runners/tensorflow/keras_tokens.py): the windows every
strategy feeds are those torch's ranks read, a Keras step's next-token loss, the evaluation's
sums, the catalog's rules (tf-ps dropped), and real short runs of gpt-nano on the byte corpus."""

from __future__ import annotations

import importlib.util
import itertools
import math

import numpy as np
import pytest

from trainscale.data import tokendata, tokens
from trainscale.measure import metrics
from trainscale.plan.matrix import RunSpec, build_runs

from conftest import launch, launch_losing_a_worker, validated

#: gpt-nano on the shipped byte corpus, small enough for a CPU test: windows of 32 ids,
#: a global batch of 4, 3 steps per epoch, 2 epochs
SEQ_LEN, BATCH, STEPS, EPOCHS = 32, 4, 3, 2
#: test tokens each evaluation scores (config eval_tokens): 128 windows, not the whole split
EVAL_TOKENS = 4096


def token_config(strategies: list[str], workers: list[int], dataset: str = "shakespeare",
                 **extra) -> dict:  # fmt: skip
    matrix = {
        "strategy": strategies, "model": ["gpt-nano"], "dataset": [dataset],
        "seq_len": [SEQ_LEN], "batch_size": [BATCH], "workers": workers,
    }  # fmt: skip
    return validated(
        {
            "study": "t",
            "epochs": EPOCHS,
            "steps_per_epoch": STEPS,
            "eval_tokens": EVAL_TOKENS,
            "matrix": matrix,
            **extra,
        }
    )


def token_spec(strategy: str, workers: int = 1, **extra) -> RunSpec:
    return build_runs(token_config([strategy], [workers], **extra), accelerator="cpu")[0][0]


# --- the windows: the same tokens in the same order as torch's ranks ---------------------------


def test_a_strategys_global_batch_stacks_torchs_rank_batches_in_rank_order():
    """tf-mirrored / tf-multiworker feed the global batch and the strategy gives replica r
    rows [r·b, (r + 1)·b): those must be what torch-ddp's rank r trains on, step by step and
    epoch by epoch (cut to steps_per_epoch)."""
    from trainscale.runners.tensorflow import keras_tokens

    spec = token_spec("tf-mirrored", 2)
    b = spec.per_worker_batch_size
    feed = keras_tokens.TokenTrain(spec, range(2), 2, b)
    assert feed.steps == STEPS and feed.rows == BATCH
    torch_ranks = [tokendata.loaders(spec, r, 2, b)[0] for r in range(2)]
    got = list(itertools.islice(feed.batches(), EPOCHS * STEPS))
    for epoch in range(1, EPOCHS + 1):
        ranks = [list(itertools.islice(t.epoch(epoch), STEPS)) for t in torch_ranks]
        for step in range(STEPS):
            x, y = got[(epoch - 1) * STEPS + step]
            assert x.dtype == y.dtype == np.int32 and x.shape == (BATCH, SEQ_LEN)
            want_x = np.concatenate([r[step][0].numpy() for r in ranks])
            want_y = np.concatenate([r[step][1].numpy() for r in ranks])
            np.testing.assert_array_equal(x, want_x)
            np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(got[0][0][:, 1:], got[0][1][:, :-1])  # targets: next ids


def test_the_tf_data_feed_and_a_horovod_workers_share_are_torchs_windows():
    from trainscale.runners.tensorflow import keras_tokens

    spec = token_spec("horovod-keras", 2)
    mine = keras_tokens.TokenTrain(spec, [1], 2, spec.per_worker_batch_size)
    torch_rank1 = tokendata.loaders(spec, 1, 2, spec.per_worker_batch_size)[0]
    want = list(itertools.islice(torch_rank1.epoch(2), STEPS))
    ds = mine.dataset(spec, 1, epochs_done=1)  # an elastic restart after epoch 1
    assert ds.element_spec[0].dtype.name == "int32"
    for (x, y), (tx, ty) in zip(ds.take(STEPS).as_numpy_iterator(), want, strict=True):
        np.testing.assert_array_equal(x, tx.numpy())
        np.testing.assert_array_equal(y, ty.numpy())


def test_the_users_token_files_feed_the_same_windows_as_torchs(tmp_path):
    """An llm.c shard (memory-mapped, read past its header) through the Keras feed."""
    from trainscale.runners.tensorflow import keras_tokens

    ids = np.random.default_rng(1).integers(0, 1000, 20_000)
    files = {s: str(tokens.write_llmc(ids, tmp_path / f"{s}.bin")) for s in ("train", "test")}
    mine = {"format": "tokens", **files, "vocab_size": 1000}
    spec = build_runs(
        token_config(["horovod-keras"], [2], dataset="mine", datasets={"mine": mine}),
        accelerator="cpu",
    )[0][0]
    feed = keras_tokens.TokenTrain(spec, [0], 2, spec.per_worker_batch_size)
    torch_rank0 = tokendata.loaders(spec, 0, 2, spec.per_worker_batch_size)[0]
    want = itertools.islice(torch_rank0.epoch(1), STEPS)
    for (x, y), (tx, ty) in zip(itertools.islice(feed.batches(), STEPS), want, strict=True):
        np.testing.assert_array_equal(x, tx.numpy())
        np.testing.assert_array_equal(y, ty.numpy())
    assert int(x.max()) < 1000


# --- one step, and the evaluation's sums ------------------------------------------------------


def test_one_keras_step_on_a_token_batch_starts_near_uniform():
    """At GPT-2's initialisation the logits are near zero: the next-token loss of the first
    step is about ln(vocabulary), finite, and the step moves it."""
    from trainscale.data import imagesets
    from trainscale.runners.tensorflow import keras_loop, keras_tokens, tf

    spec = token_spec("tf")
    info = imagesets.spec_info(spec.to_dict())
    keras_loop.keras.utils.set_random_seed(spec.seed)
    model = keras_loop.build_model(tf.OneDevice(spec), info)
    assert model.input.dtype.name == "int32"
    x, y = next(keras_tokens.TokenTrain(spec, [0], 1, BATCH).batches())
    first = model.train_on_batch(x, y, return_dict=True)["loss"]
    assert math.isfinite(first) and abs(first - math.log(info.num_classes)) < 0.3
    assert model.train_on_batch(x, y, return_dict=True)["loss"] < first


def test_token_tally_sums_what_torchs_tally_sums():
    """The scorer's next-token accuracy, loss and perplexity over the test windows equal the
    same figures computed in numpy from the network's logits."""
    from trainscale.models import keras_models
    from trainscale.runners.tensorflow import keras_eval, keras_tokens

    spec = token_spec("tf")
    net = keras_models.build("gpt-nano", (SEQ_LEN,), 256)
    windows = keras_tokens.eval_windows(spec)
    mine = windows.mine[:10]  # ten windows, in batches of 4: a short last batch
    x, y = tokens.window_batch(windows.ids, mine, SEQ_LEN)
    ds = keras_tokens.tf.data.Dataset.from_tensor_slices((x.astype(np.int32), y)).batch(4)
    got = keras_eval.token_scores_of(keras_eval.scorer(net, 256, tokens=True), ds)
    logits = net.predict(x.astype(np.int32), verbose=0).astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, y[..., None], -1).mean()
    assert got["accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == y))
    assert got["loss"] == pytest.approx(loss, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert "confusion" not in got


# --- the catalog --------------------------------------------------------------------------------

KERAS = ["tf", "tf-mirrored", "tf-multiworker", "horovod-keras", "horovod-keras-elastic"]


def test_every_keras_strategy_but_tf_ps_trains_a_gpt_on_token_data():
    runs, dropped = build_runs(token_config([*KERAS, "tf-ps"], [1, 2]), accelerator="cpu")
    assert {(r.strategy, r.workers) for r in runs} == {
        (s, w) for s in KERAS for w in (1, 2) if (s, w) != ("tf", 2)
    }
    reasons = {(d.values["strategy"], d.values["workers"]): d.reason for d in dropped}
    assert reasons.keys() == {("tf", 2), ("tf-ps", 1), ("tf-ps", 2)}
    assert reasons["tf-ps", 2].startswith("tf-ps: Keras' model.fit under ParameterServerStrategy")
    assert "cannot read disjoint windows of shakespeare" in reasons["tf-ps", 2]


def test_tf_ps_keeps_image_data():
    """The token rule drops tf-ps from token sets only."""
    runs, _ = build_runs(
        validated({"study": "t", "matrix": {"strategy": ["tf-ps"], "model": ["seed-small"],
                                            "dataset": ["digits"]}}),
        accelerator="cpu",
    )  # fmt: skip
    assert [r.strategy for r in runs] == ["tf-ps"]


# --- real runs ----------------------------------------------------------------------------------

HOROVOD = importlib.util.find_spec("horovod") is not None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "workers"),
    [
        # tf and tf-mirrored share this Keras loop: tf-mirrored at 2 trains gpt-nano in the
        # GPT study
        ("tf-multiworker", 2),
        pytest.param(
            "horovod-keras", 2,
            marks=pytest.mark.skipif(not HOROVOD, reason="horovod is not built in this venv"),
        ),
    ],
)  # fmt: skip
def test_a_keras_strategy_trains_gpt_nano_on_the_byte_corpus(tmp_path, strategy, workers):
    spec = token_spec(strategy, workers)
    out = tmp_path / "metrics.json"
    p = launch(spec, out, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)  # validated against the metrics schema
    assert rec["status"] == "ok", rec["error"]
    assert [e["steps"] for e in rec["epochs"]] == [STEPS] * EPOCHS
    assert rec["tokens_per_second"] > 0
    assert rec["tokens_per_second"] == pytest.approx(rec["throughput"] * SEQ_LEN)
    test = rec["test"]
    assert 0 <= test["accuracy"] <= 1 and test["perplexity"] >= 1
    assert test["perplexity"] == pytest.approx(math.exp(test["loss"]))
    assert test["confusion"] is None
    assert all(math.isfinite(e["train_loss"]) for e in rec["epochs"])
    assert rec["epochs"][0]["train_loss"] == pytest.approx(math.log(256), abs=0.5)
    flops = rec["flops"]
    assert flops["per_sample"] > 0 and flops["method"] == "torch twin: flop_counter"
    assert flops["analytic_per_sample"] == pytest.approx(flops["per_sample"], rel=0.01)
    assert rec["data"]["seq_len"] == SEQ_LEN and rec["data"]["vocab_size"] == 256
    assert rec["data"]["input_shape"] == [SEQ_LEN]


@pytest.mark.slow
@pytest.mark.skipif(not HOROVOD, reason="horovod is not built in this venv")
def test_elastic_keras_goes_on_with_the_windows_of_the_smaller_world(tmp_path):
    """horovod-keras-elastic loses a worker after epoch 1: the survivor reads rank 0 of 1's
    windows from the next committed epoch on, at the same global batch and steps."""
    spec = token_spec("horovod-keras-elastic", 2, epochs=6, steps_per_epoch=20)
    out, _ = launch_losing_a_worker(spec, tmp_path, "epoch 1/")
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    sizes = [m["world_size"] for m in rec["horovod"]["membership"]]
    assert sizes == [2, 1] and rec["horovod"]["final_world_size"] == 1
    assert [e["steps"] for e in rec["epochs"]] == [20] * 6
    assert all(math.isfinite(e["train_loss"]) for e in rec["epochs"])
    assert rec["test"]["perplexity"] >= 1 and rec["tokens_per_second"] > 0

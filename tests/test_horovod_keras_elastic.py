"""horovod-keras-elastic: tf-keras model.fit under hvd.elastic.run
(runners/tensorflow/horovod_keras.py), started by horovodrun with a host discovery script: plain
runs at 1 and 2 workers, and a run that loses a worker after epoch 1 and finishes on the other."""

from __future__ import annotations

import pytest

from trainscale.measure import metrics

from conftest import ELASTIC_KERAS_EPOCHS as FIXED_EPOCHS
from conftest import elastic_keras_spec as elastic_spec
from conftest import launch_losing_a_worker

#: epochs of the run that loses a worker, long enough that Horovod's host discovery (polled
#: about once a second) sees the change before the last epoch
EPOCHS = 6


@pytest.fixture(scope="module")
def fixed_size(elastic_keras_fixed) -> dict[int, dict]:
    """Records of runs that keep their 1 and 2 workers throughout (conftest: shared with the
    Keras family's tests)."""
    return elastic_keras_fixed


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_elastic_keras_trains_at_a_fixed_size(fixed_size, workers):
    rec = fixed_size[workers]
    assert rec["status"] == "ok", rec["error"]
    assert rec["test"]["accuracy"] > 0.5  # chance is 0.1
    assert len(rec["epochs"]) == FIXED_EPOCHS and {e["steps"] for e in rec["epochs"]} == {89}
    assert rec["device"]["count"] == workers and rec["horovod"]["final_world_size"] == workers
    changes = [(m["after_epoch"], m["world_size"]) for m in rec["horovod"]["membership"]]
    assert changes == [(0, workers)]
    line = rec["launch"]["command"]
    assert f"--min-np 1 --max-np {workers} --host-discovery-script" in line
    assert "TF_USE_LEGACY_KERAS=1" in line
    frameworks = rec["env"]["frameworks"]
    assert frameworks["horovod"] == "0.28.1" and "tf-keras" in frameworks


@pytest.mark.slow
def test_elastic_keras_run_finishes_with_fewer_workers_when_one_is_removed(tmp_path, fixed_size):
    """The discovery script's hosts file drops from 2 slots to 1 while epoch 1 trains: Horovod
    stops both workers at the next commit (epoch 1's end, or a later one), re-forms the ring
    with one, and model.fit goes on from the committed epoch; the run completes all its epochs
    and records the change.

    The file changes as soon as training starts, not once epoch 1 is printed: epoch 1 (which
    traces the graph) lasts seconds, the later epochs well under one here, and Horovod's
    driver polls the discovery script about once a second; on a loaded machine the change was
    seen only after the last epoch's commit when it was made after epoch 1.

    The global batch and the data order are the spec's at any size, so every epoch's training
    loss is the one of the run that kept both workers (up to float32 rounding)."""
    epochs = EPOCHS
    spec = elastic_spec(2, epochs)
    # horovodrun prefixes each worker's lines; rank 0 prints this as fit starts
    when = "]<stdout>:horovod elastic: 2 workers from epoch 1"
    out, log = launch_losing_a_worker(spec, tmp_path, when)
    rec = metrics.read(out)  # validated against the metrics schema
    assert rec["status"] == "ok", rec["error"]
    assert len(rec["epochs"]) == epochs, log[-3000:]
    assert rec["test"]["accuracy"] > 0.5, log[-3000:]
    changes = [(m["after_epoch"], m["world_size"]) for m in rec["horovod"]["membership"]]
    assert changes[0] == (0, 2) and changes[-1][1] == 1, changes
    assert 1 <= changes[-1][0] <= epochs - 1, changes
    assert "horovod elastic: 1 workers from epoch" in log
    assert rec["horovod"]["final_world_size"] == 1 and rec["device"]["count"] == 1
    # the global batch stays the spec's: one worker then takes all of it, steps are unchanged
    assert {e["steps"] for e in rec["epochs"]} == {89}  # 4 × 1437 // 64
    assert all(e["samples"] == 89 * 64 for e in rec["epochs"])
    kept = [e["train_loss"] for e in fixed_size[2]["epochs"]]  # its first FIXED_EPOCHS
    got = [e["train_loss"] for e in rec["epochs"]][:FIXED_EPOCHS]
    assert got == pytest.approx(kept, rel=1e-3), kept

"""horovod-keras-elastic: tf-keras model.fit under hvd.elastic.run (runners/horovod_keras.py),
started by horovodrun with a host discovery script: plain runs at 1 and 2 workers, and a run
that loses a worker after epoch 1 and finishes on the other."""

from __future__ import annotations

import subprocess
import time

import pytest

from trainscale import metrics
from trainscale.matrix import build_runs

from conftest import PYTHON, ROOT, launch, run_env, validated

STRATEGY = "horovod-keras-elastic"


def elastic_spec(workers: int, epochs: int):
    """seed-small on digits, scale 4 (89 steps of the global batch of 64 per epoch)."""
    m = {"strategy": [STRATEGY], "model": ["seed-small"], "dataset": ["digits"]}
    m |= {"workers": [workers], "batch_size": [64], "scale": [4]}
    return build_runs(validated({"study": "t", "epochs": epochs, "matrix": m}))[0][0]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_elastic_keras_trains_at_a_fixed_size(tmp_path, workers):
    spec = elastic_spec(workers, epochs=3)
    out = tmp_path / "metrics.json"
    p = launch(spec, out, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)  # validated against the metrics schema
    assert rec["status"] == "ok", rec["error"]
    assert rec["test"]["accuracy"] > 0.5  # chance is 0.1
    assert len(rec["epochs"]) == 3 and {e["steps"] for e in rec["epochs"]} == {89}
    assert rec["device"]["count"] == workers and rec["horovod"]["final_world_size"] == workers
    changes = [(m["after_epoch"], m["world_size"]) for m in rec["horovod"]["membership"]]
    assert changes == [(0, workers)]
    line = rec["launch"]["command"]
    assert f"--min-np 1 --max-np {workers} --host-discovery-script" in line
    assert "TF_USE_LEGACY_KERAS=1" in line
    frameworks = rec["env"]["frameworks"]
    assert frameworks["horovod"] == "0.28.1" and "tf-keras" in frameworks


@pytest.mark.slow
def test_elastic_keras_run_finishes_with_fewer_workers_when_one_is_removed(tmp_path):
    """The discovery script's hosts file drops from 2 slots to 1 after epoch 1: Horovod stops
    both workers at the next commit, re-forms the ring with one, and model.fit goes on from the
    committed epoch; the run completes all its epochs and records the change."""
    epochs = 6  # enough that host discovery (polled about once a second) sees the change
    spec = elastic_spec(2, epochs)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    out = tmp_path / "metrics.json"
    proc = subprocess.Popen(
        [PYTHON, "-m", "trainscale.launch", "--spec", spec.to_json(), "--out", str(out)],
        cwd=ROOT,
        env=run_env(TRAINSCALE_HOROVOD_HOSTS=str(hosts)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 300
    try:
        for line in proc.stdout:
            lines.append(line)
            if f"]<stdout>:epoch 1/{epochs}" in line:  # horovodrun prefixes each worker's lines
                hosts.write_text("localhost:1\n")  # take one worker away
            assert time.monotonic() < deadline, "".join(lines[-50:])
        proc.wait(timeout=60)
    finally:
        proc.kill()
    log = "".join(lines)
    assert proc.returncode == 0, log[-3000:]
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

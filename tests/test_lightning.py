"""`lightning-ddp` (PyTorch Lightning's Trainer(strategy="ddp") under torchrun) against
`torch-ddp`: the same weights from the same start and data order, the same record keys."""

import importlib.metadata as md

import numpy as np
import pytest
from packaging.requirements import Requirement
from test_envs import VENV
from test_runners import make

from trainscale.measure import metrics
from trainscale.plan.matrix import build_runs

import tap
from conftest import NAMED_BY_THE_RUN, launch, validated

#: as tests/test_runners.py's DDP-against-one-process bound (measured differences there are
#: ~3e-8 over 44 steps; a summed instead of averaged gradient differs by ~0.09)
RTOL, ATOL = 1e-4, 1e-5


def keys(rec: dict, prefix: str = "") -> set[str]:
    """Every key path of a record (dicts only; the first epoch stands for all), not inside the
    blocks named by what the run did (the launcher's variables, the set-up's phases, the
    measurements after training: Lightning's rendezvous is inside its Trainer)."""
    out = set()
    for k, v in rec.items():
        path = f"{prefix}{k}"
        out.add(path)
        if k == "epochs" and v:
            out |= keys(v[0], f"{path}[].")
        elif isinstance(v, dict) and k != "spec" and path not in NAMED_BY_THE_RUN:
            out |= keys(v, f"{path}.")
    return out


def test_lightning_installs_beside_the_pinned_torch():
    """pip's view of the venv: torch is still the pinned 2.13.0 with lightning installed, and
    every requirement of lightning (extras aside) is met by what is installed."""
    assert md.version("torch").split("+")[0] == VENV["torch"] == "2.13.0"
    assert md.version("lightning") == VENV["lightning"]
    for text in md.requires("lightning"):
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        installed = md.version(req.name).split("+")[0]
        assert req.specifier.contains(installed, prereleases=True), (text, installed)


def test_lightning_refuses_fp16_on_cpu_before_any_job():
    """Lightning would swap fp16 for bf16 on CPU with only a warning: the matrix drops it."""
    m = {"strategy": ["lightning-ddp"], "model": ["seed-small"], "dataset": ["digits"],
         "precision": ["fp16", "bf16"], "workers": [2], "batch_size": [64]}  # fmt: skip
    runs, dropped = build_runs(validated({"study": "t", "matrix": m, "accelerator": "cpu"}))
    assert [r.precision for r in runs] == ["bf16"]
    assert [d.values["precision"] for d in dropped] == ["fp16"] and "bf16" in dropped[0].reason


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_lightning_ddp_ends_with_torch_ddp_weights(tmp_path, workers):
    """From the same initial weights and data order, Lightning's DDP ends where torch-ddp
    does (SGD without momentum: a wrong gradient scale would show), after training that moved
    the weights; its record has torch-ddp's keys, its samples and throughput match the batches
    the ranks really fed, and the model learnt (chance is 0.1)."""
    opt = {"name": "sgd", "lr": 0.05}
    ddp = make("torch-ddp", workers, optimizer=opt)
    light = make("lightning-ddp", workers, optimizer=opt)
    recs, inits = {}, {}
    for s in (ddp, light):
        out = tmp_path / s.strategy / "metrics.json"
        taps = tmp_path / f"{s.strategy}-tap"
        p = launch(s, out, **tap.env(taps))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rec = recs[s.strategy] = metrics.read(out)
        assert rec["status"] == "ok", rec["error"]
        assert [e["steps"] for e in rec["epochs"]] == [1437 // 64] * 2
        tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step=workers)
        inits[s.strategy] = tap.initial_weights(taps)
    final_ddp = tap.final_weights(tmp_path / "torch-ddp-tap", "torch-ddp")
    final_light = tap.final_weights(tmp_path / "lightning-ddp-tap", "lightning-ddp")
    for k, v in inits["torch-ddp"].items():
        np.testing.assert_array_equal(inits["lightning-ddp"][k], v, err_msg=k)
    tap.assert_moved(inits["torch-ddp"], final_ddp, "torch-ddp")
    assert final_light.keys() == final_ddp.keys()
    for k in final_ddp:
        np.testing.assert_allclose(final_light[k], final_ddp[k], rtol=RTOL, atol=ATOL, err_msg=k)

    rec = recs["lightning-ddp"]
    assert rec["test"]["accuracy"] > 0.5
    assert rec["test"]["accuracy"] == pytest.approx(recs["torch-ddp"]["test"]["accuracy"], abs=0.01)
    assert keys(rec) - keys(recs["torch-ddp"]) == {"env.frameworks.lightning"}
    confusion = rec["test"]["confusion"]  # scored by the loop's shared evaluation
    assert sum(map(sum, confusion)) == rec["data"]["test_samples"] == 360
    assert sum(confusion[k][k] for k in range(10)) / 360 == rec["test"]["accuracy"]
    assert len(rec["test"]["per_class_accuracy"]) == 10
    assert keys(recs["torch-ddp"]) <= keys(rec)
    assert len(rec["memory"]["per_rank_host_rss_bytes"]) == workers
    assert rec["device"]["count"] == workers
    assert rec["env"]["frameworks"]["lightning"] == VENV["lightning"]
    assert rec["launch"]["command"].count("torch.distributed.run") == 1
    if workers > 1:
        comm = rec["communication"]
        assert comm["method"] is None and comm["note"].startswith("lightning-ddp")

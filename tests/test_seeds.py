"""`.test/seeds.yaml` as a user runs it: the seed systems added last (tf-ps at 1 and 2 workers,
horovod-keras-elastic and lightning-ddp at 2) on digits through Snakemake; every
record valid (metrics.read validates), the model learnt, and the report has its sections."""

from __future__ import annotations

import pytest
import yaml

from trainscale.measure import metrics

import tap
from conftest import ROOT, run_env, snakemake

SEEDS = ROOT / ".test" / "seeds.yaml"


@pytest.mark.slow
def test_seed_study_through_snakemake(tmp_path):
    cfg = yaml.safe_load(SEEDS.read_text())
    taps = tmp_path / "tap"  # the test plug-in: the batches every Keras run's workers fed
    env = run_env(**tap.env(taps))
    p = snakemake(tmp_path, "--cores", "2", "--configfile", str(SEEDS), env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    study = tmp_path / "results" / cfg["study"]
    recs = [metrics.read(f) for f in sorted(study.glob("runs/**/metrics.json"))]
    strategies = cfg["matrix"]["strategy"]
    assert sorted((r["spec"]["strategy"], r["spec"]["workers"]) for r in recs) == sorted(
        [("tf-ps", 1), *((s, 2) for s in strategies)]
    )
    for rec in recs:
        assert rec["status"] == "ok", rec["error"]
        assert rec["test"]["accuracy"] > 0.5  # chance is 0.1
        assert rec["device"]["count"] == rec["spec"]["workers"]
        per_class = rec["test"]["per_class_accuracy"]
        assert len(per_class) == 10 and rec["test"]["class_names"] == [str(i) for i in range(10)]
        if rec["spec"]["strategy"] != "lightning-ddp":  # tf-ps at 1 and 2, Keras elastic
            tap.assert_recorded_samples_were_fed(rec, taps)
    page = (study / "report.html").read_text()
    assert 'id="per-class"' in page  # the per-class section, with the class names
    for s in strategies:
        assert s in page

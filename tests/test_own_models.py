"""The user's own models (config `code:` and `models:`): a package in a folder of its own is
checked before any job (imports, logits' shape, the Keras twin's count), then trained through
Snakemake by the strategies that read it in their own way (tests/test_thirdparty.py trains an own
model under the rest); a model that raises while training fails alone."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers import report_of_runs

from trainscale.plan.check import config_problems
from trainscale.plan.matrix import build_runs

from conftest import (
    ROOT,
    base_config,
    load_yaml,
    preflight_check,
    snakemake,
    study_records,
    validated,
)  # fmt: skip

SCHEMA = load_yaml(ROOT / "workflow" / "schemas" / "config.schema.yaml")

#: a small image model whose `blocks` run it end to end, its Keras twin, a twin of another
#: size, a model with logits of the wrong shape, and one that raises on its third step
PACKAGE = {
    "mlp.py": """
        import torch
        from torch import nn

        class MLP(nn.Module):
            def __init__(self, input_shape, classes, hidden):
                super().__init__()
                c, h, w = input_shape
                self.blocks = nn.Sequential(
                    nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU(),
                    nn.Linear(hidden, classes),
                )
                self.calls = 0

            def forward(self, x):
                return self.blocks(x)

        def build(*, input_shape, classes, hidden=32):
            return MLP(input_shape, classes, hidden)

        class Flaky(MLP):
            def forward(self, x):
                self.calls += 1
                if self.training and self.calls == 3:
                    raise RuntimeError("planted: the third step of a user model fails")
                return self.blocks(x)

        def flaky(*, input_shape, classes, hidden=32):
            return Flaky(input_shape, classes, hidden)

        def wrong(*, input_shape, classes, hidden=32):
            return MLP(input_shape, classes + 1, hidden)
    """,
    "noisy.py": """
        import logging, sys, warnings
        from mymodels.mlp import MLP

        logging.basicConfig(stream=sys.stdout, level=logging.INFO)  # as some libraries do
        log = logging.getLogger("noisy")

        class Noisy(MLP):
            def __init__(self, *args):
                super().__init__(*args)
                print('{"mine": {"problems": ["not the answer"]}}')
                print("building", file=sys.stderr)
                log.info("built a noisy model")
                warnings.warn("noisy: constructed")

            def forward(self, x):
                print('{"forward": true}')
                log.info("forward of %s", tuple(x.shape))
                warnings.warn("noisy: forward")
                return super().forward(x)

        def build(*, input_shape, classes, hidden=32):
            print("[1, 2", flush=True)  # half a JSON value, before the model exists
            return Noisy(input_shape, classes, hidden)
    """,
    "mlp_keras.py": """
        import tf_keras as keras

        def build(*, input_shape, classes, hidden=32):
            c, h, w = input_shape
            return keras.Sequential([
                keras.Input((h, w, c)), keras.layers.Flatten(),
                keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(classes),
            ])

        def other(*, input_shape, classes, hidden=32):
            return build(input_shape=input_shape, classes=classes, hidden=2 * hidden)
    """,
}


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A folder holding the package `mymodels`, as a user's `code:` folder."""
    root = tmp_path_factory.mktemp("code")
    pkg = root / "mymodels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in PACKAGE.items():
        (pkg / name).write_text(textwrap.dedent(text))
    return root


def own_config(code: Path, models: dict, **matrix) -> dict:
    cfg = base_config(**{"model": list(models), **matrix})
    cfg.update(code=[str(code)], models=models)
    return validated(cfg)


def test_a_model_under_code_is_checked_and_planned(package, capfd):
    models = {"mine": {"torch": "mymodels.mlp:build", "kwargs": {"hidden": 16},
                       "blocks": "blocks"}}  # fmt: skip
    cfg = own_config(package, models, strategy=["torch-pipeline"], workers=[2])
    assert config_problems(cfg, SCHEMA) == []
    assert "models.mine: 1,210 parameters at input 1x8x8, 10 classes" in capfd.readouterr().err
    runs, _ = build_runs(cfg)
    assert {r.own_model.params for r in runs} == {64 * 16 + 16 + 16 * 10 + 10}
    assert runs[0].own_model.block_count == 4 and runs[0].own_model.code == (str(package),)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"torch": "mymodelz.mlp:build"}, "models.bad.torch: module 'mymodelz' not found"),
        ({"torch": "mymodels.mlp:biuld"}, "models.bad.torch: mymodels.mlp has no 'biuld'"),
        ({"torch": "mymodels.mlp:wrong"}, "models.bad: logits of shape (2, 11)"),
        ({"torch": "mymodels.mlp:build", "keras": "mymodels.mlp_keras:other"},
         "models.bad.keras: the Keras twin has 4,810 parameters, the PyTorch model 2,410"),
        ({"torch": "mymodels.mlp:build", "blocks": "layers"}, "models.bad.blocks:"),
    ],
)  # fmt: skip
def test_what_cannot_run_is_stopped_before_any_job_with_the_key(package, entry, expected):
    problems = config_problems(own_config(package, {"bad": entry}), SCHEMA)
    assert any(expected in p for p in problems), problems


def test_an_embedding_or_head_that_cannot_be_split_by_vocabulary_is_named():
    """models.NAME.embedding and head name an nn.Embedding and an nn.Linear of the model, by
    module path (an index may count from the end): checked in the pre-flight build."""
    from torch import nn

    from trainscale.models.preflight import _vocabulary_modules

    net = nn.Module()
    net.blocks = nn.Sequential(nn.Embedding(16, 4), nn.Linear(4, 4), nn.Linear(4, 16))
    ok = {"embedding": "blocks.0", "head": "blocks.-1"}
    assert _vocabulary_modules(net, ok, "lm") == []
    bad = _vocabulary_modules(net, {"embedding": "blocks.1", "head": "blocks.3"}, "lm")
    assert bad == [
        "models.lm.embedding: 'blocks.1' is a Linear, not a torch.nn.Embedding: name the "
        "Embedding itself (tensor parallelism splits its matrix by vocabulary)",
        "models.lm.head: 'blocks.3' names no module of the model (blocks.3: 3 modules, no index 3)",
    ]


def test_what_a_model_prints_logs_or_warns_never_reaches_the_preflight_answer(package, tmp_path):
    """The pre-flight child's answer is a file of its own: a model that prints JSON-looking
    text, logs to stdout and warns, in its constructor and its forward, is checked like any
    other, under `trainscale check` and `snakemake -n`; what it said is in the child's log."""
    models = {"mine": {"torch": "mymodels.noisy:build", "blocks": "blocks"}}
    cfg = own_config(package, models, strategy=["torch-ddp"], workers=[2])
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({**cfg, "study": "noisy"}))
    p, said = preflight_check(tmp_path)
    assert "models.mine: 2,410 parameters at input 1x8x8, 10 classes" in p.stderr
    assert "not the answer" not in p.stdout + p.stderr
    for line in ('{"mine": {"problems": ["not the answer"]}}', "building",
                 "INFO:noisy:built a noisy model", "UserWarning: noisy: constructed",
                 '{"forward": true}', "INFO:noisy:forward of (2, 1, 8, 8)",
                 "UserWarning: noisy: forward"):  # fmt: skip
        assert line in said, said
    for cache in (tmp_path / ".cache").iterdir():
        shutil.rmtree(cache)  # Snakemake's pre-flight asks the child again
    p = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "study.yaml"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "train" in p.stdout


def test_an_unknown_model_name_is_named_with_the_fix():
    cfg = base_config(model=["seed-smal"])
    problems = config_problems(cfg, SCHEMA)
    assert any("matrix.model[0]: 'seed-smal'" in p and "did you mean 'seed-small'" in p
               for p in problems)  # fmt: skip


#: the strategies own_study runs at 2 workers
TWO = ("torch-fsdp", "torch-pipeline", "tf-mirrored")


@pytest.fixture(scope="module")
def own_study(package, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("own-study")
    study = {
        "study": "ci-own", "epochs": 2, "repeats": 1, "steps_per_epoch": 4,
        "collectives": {"enabled": False}, "code": [str(package)],
        "models": {
            "mine": {"torch": "mymodels.mlp:build", "keras": "mymodels.mlp_keras:build",
                     "blocks": "blocks"},
            "flaky": {"torch": "mymodels.mlp:flaky"},
        },
        "matrix": {
            # torch alone at 1 worker, flaky only under torch. Every PyTorch-family strategy
            # trains an own model at 2 in tests/test_thirdparty.py: here those that read the
            # model's `blocks` (FSDP's units, the pipeline's cut) and the Keras twin; ZeRO-2,
            # which takes the model whole, is its deepspeed-zero2 run there.
            "strategy": ["torch", *TWO],
            "model": ["mine", "flaky"], "dataset": ["digits"], "batch_size": [32],
            "workers": [1, 2],
            "exclude": [*({"model": "flaky", "strategy": s} for s in TWO),
                        *({"workers": 1, "strategy": s} for s in TWO)],
        },
    }  # fmt: skip
    cfg = work / "study.yaml"
    cfg.write_text(yaml.safe_dump(study))
    # up to runs.csv: the one fact of the report read here is rendered from these runs
    # (helpers.report_of_runs), not through the figure and report rules
    p = snakemake(work, "results/ci-own/runs.csv", "--cores", "2", "--configfile", str(cfg))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = work / "results" / "ci-own"
    return {"results": results, "recs": [r for r, _ in study_records(results)]}


def test_every_strategy_trains_the_users_model(own_study, tmp_path):
    mine = [r for r in own_study["recs"] if r["spec"]["model"] == "mine"]
    ran = {(r["spec"]["strategy"], r["spec"]["workers"]) for r in mine}
    assert ran == {("torch", 1), *((s, 2) for s in TWO)}
    assert [(r["spec"]["strategy"], r["error"]) for r in mine if r["status"] != "ok"] == []
    assert {r["model"]["params"] for r in mine} == {64 * 32 + 32 + 32 * 10 + 10}
    assert all(r["flops"]["per_sample"] > 0 for r in mine)
    html = report_of_runs(own_study["results"], tmp_path / "report.html")
    assert "user model (mymodels.mlp:build)" in html


def test_a_model_that_raises_fails_alone_with_its_traceback(own_study):
    flaky = [r for r in own_study["recs"] if r["spec"]["model"] == "flaky"]
    assert {r["status"] for r in flaky} == {"failed"}
    assert all("planted: the third step of a user model fails" in r["error"] for r in flaky)
    assert all("mlp.py" in r["error"] for r in flaky)  # its own traceback

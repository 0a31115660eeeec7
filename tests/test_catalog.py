"""The catalog is the one table of strategies and models: the schema, the launcher forms, the
runners and the import graph agree with it."""

from __future__ import annotations

import ast
import subprocess

import pytest

from trainscale.plan import catalog
from trainscale.plan.catalog import Cell

from conftest import PYTHON, ROOT, SCHEMA, load_yaml, run_env

PACKAGE = ROOT / "workflow" / "trainscale"


def _matrix_enum(key: str) -> list[str]:
    return load_yaml(SCHEMA)["properties"]["matrix"]["properties"][key]["items"]["enum"]


def test_schema_strategy_enum_is_the_catalogs():
    assert _matrix_enum("strategy") == list(catalog.STRATEGIES)
    highlight = load_yaml(SCHEMA)["properties"]["report"]["properties"]["highlight"]
    assert highlight["items"]["enum"] == list(catalog.STRATEGIES)  # report.highlight names them


def test_schema_names_every_catalog_model_and_admits_own_ones():
    """matrix.model takes a built-in or a name under `models:` (checked by the pre-flight, not
    by an enum): the schema's pattern admits every built-in and its description lists them."""
    import re

    item = load_yaml(SCHEMA)["properties"]["matrix"]["properties"]["model"]["items"]
    assert "enum" not in item
    for name in catalog.MODELS:
        assert re.fullmatch(item["pattern"], name) and name in item["description"], name


def test_every_precision_of_a_strategy_is_in_the_schema():
    allowed = set(_matrix_enum("precision"))
    for s in catalog.STRATEGIES.values():
        assert s.precisions and set(s.precisions) <= allowed, s.name


def test_every_strategy_has_a_runner_module_and_a_launcher_form():
    from trainscale.launch.commands import LAUNCHER_FORMS

    for s in catalog.STRATEGIES.values():
        module = PACKAGE / "runners" / s.runtime / f"{s.runner.replace('.', '/')}.py"
        assert module.is_file(), s.name
        assert s.launcher in LAUNCHER_FORMS, s.name


def test_row_facts_are_consistent():
    for s in catalog.STRATEGIES.values():
        assert s.one_process == (s.launcher == "single-process"), s.name
        assert not (s.one_process and s.multi_node), s.name
        assert not s.one_device or s.one_process, s.name
        # tensor parallelism moves activations, modelled apart (comm_model.tp_bytes)
        tp = s.name in catalog.TENSOR_PARALLEL
        assert (s.volume_factor is None) == (s.collectives is None) or tp, s.name
        assert s.runtime in ("torch", "tensorflow"), s.name
        assert not s.needs_gpus or s.why_gpus, s.name
    colours = [s.colour for s in catalog.STRATEGIES.values()]
    assert len(set(colours)) == len(colours)


def test_accessors():
    assert catalog.strategy("torch-fsdp").volume_factor == 1.5
    assert list(catalog.strategy_colours()) == list(catalog.STRATEGIES)
    assert catalog.strategy_colours()["torch"] == (1 / 255, 115 / 255, 178 / 255)
    assert catalog.names(runner="pytorch", one_process=False) == ("torch-ddp", "torch-fsdp")
    assert set(catalog.comm_volumes("torch.distributed")) == {
        "torch-ddp",
        "torch-fsdp",
        *(f"deepspeed-zero{i}" for i in range(4)),
        "lightning-ddp",
    }
    assert "tf" not in catalog.comm_volumes() and "horovod-keras" in catalog.comm_volumes()
    with pytest.raises(KeyError, match="known: torch"):
        catalog.strategy("torch-zero")
    with pytest.raises(KeyError, match="known: seed-small"):
        catalog.model("lenet")


def _cell(**kw) -> Cell:
    values = {
        "strategy": "torch",
        "model": "seed-small",
        "dataset": "digits",
        "workers": 1,
        "nodes": 1,
        "batch_size": 32,
        "batch_mode": "global",
        "precision": "fp32",
        "accelerator": "cpu",
        "input_side": 8,
    }
    return Cell(**{**values, **kw})


@pytest.mark.parametrize(
    "cell, reason",
    [
        (_cell(), None),
        (_cell(workers=2), "torch is one process on one device: needs workers=1, nodes=1"),
        (_cell(strategy="tf", nodes=2), "tf is one process on one device"),
        (_cell(strategy="torch-dp", nodes=2), "torch-dp (nn.DataParallel) is one process on one"),
        (_cell(strategy="torch-dp", workers=2), "torch-dp with workers>1 needs GPUs: without"),
        (_cell(strategy="torch-dp", workers=2, accelerator="cuda"), None),
        (_cell(strategy="tf-mirrored", workers=2), None),
        (_cell(strategy="tf-mirrored", nodes=2), "tf-mirrored (MirroredStrategy) is one process"),
        (_cell(strategy="torch-ddp", workers=2, nodes=2), None),
        (_cell(strategy="torch-pipeline", workers=4), "seed-small has 3 blocks, too few for 4"),
        (_cell(strategy="torch-pipeline", precision="fp16"), "fp16 needs a loss scaler"),
        (_cell(strategy="torch-pipeline", precision="bf16"), None),
        (
            _cell(strategy="torch-pipeline", workers=2, microbatches=1, schedule="1f1b"),
            "1F1B needs microbatches (1) ≥ stages (2)",
        ),
        (_cell(model="mnist-convnet"), "mnist-convnet needs inputs of at least 16×16; digits"),
    ],
)
def test_why_not(cell: Cell, reason: str | None):
    got = catalog.why_not(cell)
    if reason is None:
        assert got is None
    else:
        assert reason in got


def test_catalog_matrix_and_launch_import_no_framework_and_no_runner():
    code = (
        "import sys, trainscale.plan.catalog, trainscale.plan.matrix, trainscale.launch.supervise\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow')\n"
        "       or m.startswith('trainscale.runners')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([PYTHON, "-c", code], check=True, env=run_env())


#: Modules outside runners/ that still import from it, and why: none since the all-reduce
#: benchmark's worker became a runner itself.
# (the all-reduce benchmark's worker, which uses detect_rank and leave, is a runner itself now:
# trainscale/runners/collectives.py; its record's definitions are trainscale.measure.collectives)
STILL_IMPORTING_RUNNERS: dict[str, str] = {}


def test_nothing_outside_runners_imports_runners():
    offenders = set()
    for path in PACKAGE.rglob("*.py"):
        if "runners" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n == "trainscale.runners" or n.startswith("trainscale.runners.") for n in names):
                offenders.add(str(path.relative_to(ROOT)))
    assert offenders == set(STILL_IMPORTING_RUNNERS)

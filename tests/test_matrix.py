import json

import pytest
from snakemake.exceptions import WorkflowError

from trainscale.plan import check, matrix
from trainscale.plan.matrix import ConfigError, RunSpec, build_runs

from conftest import ROOT, base_config, load_yaml, shipped_studies_cwd, validated


def test_defaults_come_from_schema():
    cfg = base_config()
    assert cfg["epochs"] == 2 and cfg["repeats"] == 1 and cfg["threads_per_worker"] == 1
    assert cfg["optimizer"] == {
        "name": "adam",
        "lr": 0.001,
        "betas": [0.9, 0.999],
        "eps": 1e-7,
        "weight_decay": 0.0,
        "momentum": 0.0,
        "fused": "auto",
    }
    assert cfg["matrix"]["batch_mode"] == ["global"] and cfg["matrix"]["precision"] == ["fp32"]


@pytest.mark.parametrize(
    "bad, needle",
    [
        (
            {
                "study": "s",
                "matrix": {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]},
                "epoch": 3,
            },
            "epoch",
        ),
        (
            {
                "study": "s",
                "matrix": {
                    "strategy": ["tensorflo"],
                    "model": ["seed-small"],
                    "dataset": ["digits"],
                },
            },
            "tensorflo",
        ),
        (
            {
                "study": "s",
                "matrix": {
                    "strategy": ["torch"],
                    "model": ["seed-small"],
                    "dataset": ["digits"],
                    "batch_size": [0],
                },
            },
            "0",
        ),
        (
            {
                "study": "../x",
                "matrix": {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]},
            },
            "../x",
        ),
        (
            {
                "study": "s",
                "matrix": {
                    "strategy": ["torch"],
                    "model": ["seed-small"],
                    "dataset": ["digits"],
                    "precision": ["fp8"],
                },
            },
            "fp8",
        ),
    ],
)
def test_schema_rejects_bad_config_naming_the_value(bad, needle):
    with pytest.raises(WorkflowError) as e:
        validated(bad)
    assert needle in str(e.value)


def test_cartesian_product_with_repeats_and_paths():
    cfg = base_config(strategy=["torch", "torch-ddp"], batch_size=[32, 64], workers=[1, 2])
    cfg["repeats"] = 2
    runs, dropped = build_runs(cfg)
    # torch: workers 1 only (2 batch sizes); ddp: 2 batch sizes x 2 worker counts; x2 repeats
    assert len(runs) == (2 + 4) * 2
    assert [d.reason for d in dropped] == [
        "torch is one process on one device: needs workers=1, nodes=1"
    ] * 2
    paths = {r.path for r in runs}
    assert len(paths) == len(runs)
    r = runs[0]
    assert r.path == (
        "strategy~torch/model~seed-small/dataset~digits/scale~1/batch_size~32/"
        "batch_mode~global/workers~1/nodes~1/precision~fp32/repeat~0"
    )
    assert {x.seed for x in runs if x.cell == r.cell} == {0, 1}


def test_spec_roundtrips_through_json():
    runs, _ = build_runs(base_config(strategy=["torch-ddp"], workers=[2]))
    spec = runs[0]
    assert RunSpec.from_json(spec.to_json()) == spec
    d = json.loads(spec.to_json())
    assert d["global_batch_size"] == 128 and d["per_worker_batch_size"] == 64
    assert d["world_size"] == 2


def test_batch_modes():
    cfg = base_config(
        strategy=["torch-ddp"],
        workers=[4],
        nodes=[2],
        batch_size=[64],
        batch_mode=["global", "per_worker"],
    )
    runs, _ = build_runs(cfg)
    by_mode = {r.batch_mode: r for r in runs}
    assert (by_mode["global"].global_batch_size, by_mode["global"].per_worker_batch_size) == (64, 8)
    assert (
        by_mode["per_worker"].global_batch_size,
        by_mode["per_worker"].per_worker_batch_size,
    ) == (512, 64)


def test_lr_scaling():
    assert matrix.effective_lr(0.1, "none", 512, 128) == 0.1
    assert matrix.effective_lr(0.1, "linear", 512, 128) == pytest.approx(0.4)
    assert matrix.effective_lr(0.1, "sqrt", 512, 128) == pytest.approx(0.2)
    cfg = base_config(strategy=["torch-ddp"], workers=[1, 2], batch_mode=["per_worker"])
    cfg["lr_scaling"] = "linear"
    runs, _ = build_runs(cfg)
    assert sorted(r.lr for r in runs) == pytest.approx([0.001, 0.002])


def test_impossible_combinations_are_dropped_with_reasons():
    cfg = base_config(
        strategy=["torch-dp"], model=["seed-small", "alexnet"], workers=[1, 2], nodes=[1, 2]
    )
    runs, dropped = build_runs(cfg, accelerator="cpu")
    assert [(r.model, r.workers, r.nodes) for r in runs] == [("seed-small", 1, 1)]
    reasons = {d.reason for d in dropped}
    assert any("nodes=1" in r for r in reasons)
    assert any("silently runs one replica" in r for r in reasons)
    assert any("alexnet needs inputs of at least 63×63" in r for r in reasons)
    line = matrix.summary(runs, dropped)
    assert line.startswith("1 runs, 7 combinations dropped (")
    # with GPUs, DataParallel over 2 devices is a real strategy
    runs, _ = build_runs(cfg, accelerator="cuda")
    assert {(r.model, r.workers, r.nodes) for r in runs} == {
        ("seed-small", 1, 1),
        ("seed-small", 2, 1),
    }


def test_exclude_partial_mappings():
    cfg = base_config(strategy=["torch-ddp"], workers=[1, 2], batch_size=[32, 64])
    cfg["matrix"]["exclude"] = [{"workers": 2, "batch_size": 32}]
    runs, dropped = build_runs(cfg)
    assert {(r.workers, r.batch_size) for r in runs} == {(1, 32), (1, 64), (2, 64)}
    assert [d.reason for d in dropped] == ["excluded by matrix.exclude"]


def test_indivisible_global_batch_is_an_error_naming_key_and_fix():
    cfg = base_config(strategy=["torch-ddp"], workers=[3], batch_size=[64])
    with pytest.raises(ConfigError, match=r"matrix.batch_size 64 .* 3 workers .*exclude"):
        build_runs(cfg)


def test_empty_matrix_is_an_error():
    cfg = base_config(strategy=["torch"], workers=[2])
    with pytest.raises(ConfigError, match="matrix is empty"):
        build_runs(cfg)


def test_unimplemented_strategy_is_an_error(monkeypatch):
    from trainscale.plan import matrix

    # every strategy of the vocabulary runs in this version: pretend one does not
    monkeypatch.setattr(matrix, "IMPLEMENTED", matrix.IMPLEMENTED - {"torch-ddp"})
    cfg = base_config(strategy=["torch", "torch-ddp"])
    with pytest.raises(ConfigError, match=r"matrix.strategy: torch-ddp not implemented"):
        build_runs(cfg)


def test_shipped_configs_build(root, tmp_path, monkeypatch):
    # .test/imagedata.yaml trains on what `snakemake export_data` writes, .test/thirdparty.yaml
    # imports from .test/models, both relative to the directory Snakemake runs in
    shipped_studies_cwd(tmp_path)
    monkeypatch.chdir(tmp_path)
    for path in [ROOT / "config.yaml", *sorted((ROOT / ".test").glob("*.yaml"))]:
        runs, _ = build_runs(validated(load_yaml(path)))
        assert runs, path


def test_fill_defaults_fills_what_snakemake_validate_fills():
    """The workflow fills the schema's defaults with check.fill_defaults (no second read of
    the schema): the config it gives every shipped study, laid over config.yaml as Snakemake
    lays it, must be the one snakemake.utils.validate gives."""
    from trainscale.plan import overlay

    schema = load_yaml(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    base = load_yaml(ROOT / "config.yaml")
    studies = [{}, *(load_yaml(p) for p in sorted((ROOT / ".test").glob("*.yaml")))]
    bare = {
        "study": "bare",
        "matrix": {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]},
    }
    for config in [*(overlay.overlay(base, s) for s in studies), bare]:
        expected = validated(config)  # a filled copy
        check.fill_defaults(config, schema)
        assert config == expected, config["study"]
    assert bare["repeats"] == 1 and bare["matrix"]["batch_size"] == [128]  # filled in


def test_thousand_cell_matrix_builds_quickly():
    cfg = base_config(
        strategy=["torch", "torch-dp", "torch-ddp"],
        model=["seed-small", "seed-large", "mnist-convnet", "resnet50", "googlenet"],
        dataset=["synthetic-mnist"],
        batch_size=[64, 128, 256, 512, 1024],
        workers=[1, 2, 4, 8, 16],
    )
    cfg["repeats"] = 2
    runs, dropped = build_runs(cfg, accelerator="cuda")
    assert len(runs) == (5 * 5 * (1 + 5 + 5)) * 2 - 0  # torch w1; dp and ddp all worker counts
    assert len(dropped) == 5 * 5 * 4


def test_batchnorm_models_need_two_samples_per_worker():
    cfg = base_config(
        strategy=["torch-ddp"],
        model=["resnet50", "seed-small"],
        dataset=["synthetic-cifar10"],
        batch_size=[4],
        workers=[2, 4],
    )
    runs, dropped = build_runs(cfg)
    assert {(r.model, r.workers) for r in runs} == {
        ("resnet50", 2),
        ("seed-small", 2),
        ("seed-small", 4),
    }
    assert [d.reason for d in dropped] == [
        "resnet50 has BatchNorm: needs at least 2 samples per worker"
    ]


def test_a_pair_is_left_while_any_of_its_cells_escapes_exclude():
    """trainscale.plan.exclusions.pairs_left: a rule that names other keys drops a (model,
    data set) pair only where it covers every value of those keys."""
    from trainscale.plan.exclusions import pairs_left

    axes = {"model": ["a", "b"], "dataset": ["toks", "imgs"], "seq_len": [32, 64],
            "batch_size": [8, 16], "workers": [1]}  # fmt: skip
    tokens = {"toks": True, "imgs": False}
    every = {(m, "toks", t) for m in "ab" for t in (32, 64)} | {("a", "imgs", 0), ("b", "imgs", 0)}
    assert pairs_left(axes, [], tokens) == every
    rules = [{"model": "a", "dataset": "toks", "seq_len": 64},
             {"model": "b", "dataset": "toks", "batch_size": 8},  # 16 is left
             {"model": "b", "dataset": "imgs", "workers": 1},  # every value: dropped
             {"seq_len": 32, "model": "b"}]  # image sets have no seq_len: left  # fmt: skip
    assert pairs_left(axes, rules, tokens) == every - {("a", "toks", 64), ("b", "imgs", 0),
                                                       ("b", "toks", 32)}  # fmt: skip

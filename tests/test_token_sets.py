"""The user's token files in a study (config `datasets: {NAME: {format: tokens, ...}}`): both
file formats train, and what cannot train is stopped before any job with the key named."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from trainscale.data import export_data, tokens
from trainscale.plan.check import config_problems
from trainscale.plan.matrix import ConfigError, build_runs
from trainscale.plan.overlay import BASE_CONFIG

from conftest import PYTHON, ROOT, base_config, launch, load_yaml, run_env, validated

SCHEMA = load_yaml(ROOT / "workflow" / "schemas" / "config.schema.yaml")


def token_config(entry: dict, **matrix) -> dict:
    m = {"model": ["gpt-nano"], "dataset": ["mine"], "seq_len": [32], "batch_size": [4]}
    cfg = base_config(**{**m, **matrix})
    cfg.update(datasets={"mine": entry}, steps_per_epoch=2, repeats=1)
    return validated(cfg)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """The shipped corpus written as nanoGPT .bin files and as llm.c shards (export-data)."""
    return export_data.export("shakespeare", "data", tmp_path_factory.mktemp("tokens"))


@pytest.mark.parametrize("kind", ["nanogpt", "llmc"])
def test_a_user_token_file_trains_in_either_format(exported, kind, tmp_path):
    entry = exported[f"shakespeare-{kind}"]
    (spec,), _ = build_runs(token_config(entry))
    assert spec.token_source.vocab_size == 256 and "dataset~mine/seq_len~32" in spec.path
    out = tmp_path / "metrics.json"
    p = launch(spec, out)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok", rec["error"]
    assert rec["data"]["format"] == "tokens" and rec["data"]["vocab_size"] == 256
    assert rec["tokens_per_second"] > 0 and rec["test"]["perplexity"] > 1


def test_both_formats_hold_the_same_ids(exported):
    nano, llmc = (
        tokens.open_tokens(exported[f"shakespeare-{k}"]["train"]) for k in ("nanogpt", "llmc")
    )
    assert llmc.offset == 1024 and nano.offset == 0  # told apart by llm.c's magic alone
    np.testing.assert_array_equal(nano.ids(), llmc.ids())
    np.testing.assert_array_equal(nano.ids(), tokens.byte_corpus()[0])


def test_ids_not_below_vocab_size_stop_the_study_naming_the_key(tmp_path):
    ids = np.arange(5000) % 300  # ids up to 299
    entry = {
        "format": "tokens",
        "train": str(tokens.write_nanogpt(ids, tmp_path / "train.bin")),
        "test": str(tokens.write_nanogpt(ids, tmp_path / "test.bin")),
        "vocab_size": 256,
    }
    problems = config_problems(token_config(entry), SCHEMA)
    assert any("datasets.mine.vocab_size" in p and "299" in p for p in problems), problems
    assert all(p.startswith("datasets.mine.") for p in problems)


def test_snakemake_dry_run_stops_on_a_bad_token_file(tmp_path):
    ids = np.arange(5000) % 300
    train = tokens.write_llmc(ids, tmp_path / "train.bin")
    study = tmp_path / "study.yaml"
    study.write_text(
        "study: badtokens\n"
        f"datasets: {{mine: {{format: tokens, train: {train}, test: {train}, vocab_size: 256}}}}\n"
        "matrix: {strategy: [torch], model: [gpt-nano], dataset: [mine]}\n"
    )
    p = subprocess.run(
        [PYTHON, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(study),
         "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile")],
        env=run_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode != 0
    assert "datasets.mine.vocab_size" in p.stdout + p.stderr


def test_too_few_tokens_for_a_batch_per_rank_is_a_config_error(tmp_path):
    ids = np.arange(100) % 256  # 3 windows of 32: fewer than 2 ranks × 2 (global batch 4)
    entry = {
        "format": "tokens",
        "train": str(tokens.write_nanogpt(ids, tmp_path / "train.bin")),
        "test": str(tokens.write_nanogpt(ids, tmp_path / "test.bin")),
        "vocab_size": 256,
    }
    with pytest.raises(ConfigError, match=r"datasets\.mine\.train: .*fewer workers"):
        build_runs(token_config(entry, strategy=["torch-ddp"], workers=[2]))


def test_a_missing_or_ragged_file_and_missing_keys_are_named(tmp_path):
    ragged = tmp_path / "odd.bin"
    ragged.write_bytes(b"\x01\x02\x03")  # 3 bytes: no whole number of uint16 ids
    missing = {"format": "tokens", "train": str(tmp_path / "nope.bin"), "test": str(ragged),
               "vocab_size": 256}  # fmt: skip
    problems = config_problems(token_config(missing), SCHEMA)
    assert any(p.startswith("datasets.mine.train:") and "does not exist" in p for p in problems)
    assert any(p.startswith("datasets.mine.test:") and "whole number" in p for p in problems)
    keyless = config_problems(token_config({"format": "tokens", "train": str(ragged)}), SCHEMA)
    assert any("missing test, vocab_size" in p for p in keyless), keyless


def test_images_and_tokens_in_one_study_pair_each_model_with_its_data(exported):
    cfg = base_config(
        model=["gpt-nano", "seed-small"], dataset=["digits", "shakespeare"], seq_len=[32, 64]
    )
    runs, dropped = build_runs(cfg)
    assert {(r.model, r.dataset, r.seq_len) for r in runs} == {
        ("seed-small", "digits", 0), ("gpt-nano", "shakespeare", 32),
        ("gpt-nano", "shakespeare", 64),
    }  # fmt: skip
    assert all("seq_len" not in r.path for r in runs if r.dataset == "digits")
    assert any("trains on token ids; digits holds images" in d.reason for d in dropped)
    assert BASE_CONFIG.is_file()

"""The ready GPU-cluster studies (examples/h100-*.yaml, docs/gpu-cluster.md) plan as a login
node plans them: `trainscale check` with the CPU planner (`accelerator: cuda`, their
`memory.limit_gib`), one cell's memory traced and the rest with --no-memory (tracing every
Llama 8B cell takes minutes), and `snakemake -n --profile profiles/slurm`, whose jobs ask SLURM
for what config `slurm` says."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from trainscale.launch.slurm import build_mem_mb

from conftest import PYTHON, ROOT, SNAKEMAKE, run_env

EXAMPLES = {"h100-llama8b": 24, "h100-resnet50": 30}  # runs each plans


def trainscale_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "trainscale", "check", "--base", str(ROOT / "config.yaml"), *args],
        cwd=tmp_path, env=run_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_plans_on_a_login_node(name, tmp_path):
    p = trainscale_check(tmp_path, "--no-memory", str(ROOT / "examples" / f"{name}.yaml"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"study '{name}': {EXAMPLES[name]} runs" in p.stdout, p.stdout
    cfg = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    assert cfg["accelerator"] == "cuda" and cfg["memory"]["limit_gib"] == 79.2
    assert cfg["slurm"] == {"exclusive": True, "gpus_per_node": 8, "constraint": "h100"}
    if name == "h100-resnet50":  # one study: DDP with channels_last beside the rest without
        assert "3 × horovod-torch: memory_format channels_last" in p.stdout
        assert "deepspeed-zero1: memory_format channels_last" in p.stdout


def test_one_traced_cell_of_the_resnet_study_fits_an_h100(tmp_path):
    cfg = yaml.safe_load((ROOT / "examples" / "h100-resnet50.yaml").read_text())
    cfg["matrix"].update(strategy=["torch-ddp"], nodes=[1], memory_format=["channels_last"])
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump(cfg))
    p = trainscale_check(tmp_path, str(one))
    assert p.returncode == 0, p.stdout + p.stderr
    found = re.search(r"torch-ddp resnet50 .* N=8, batch 256 per_worker, bf16: ([\d.]+) GiB "
                      r"\(traced\)", p.stdout)  # fmt: skip
    assert found, p.stdout + p.stderr
    assert 1 < float(found.group(1)) < 79.2 * 0.9


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_dry_runs_through_the_slurm_profile(name, tmp_path):
    cfg = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    cfg["memory"]["check"] = "off"  # traced above for one cell; every cell takes minutes
    study = tmp_path / f"{name}.yaml"
    study.write_text(yaml.safe_dump(cfg))
    p = subprocess.run(
        [SNAKEMAKE, "--directory", str(tmp_path / "w"), "-n", "--profile", "profiles/slurm",
         "--configfile", str(study), "--quiet", "host"],  # the job blocks shown (docs/config.md)
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = re.findall(r"^rule train:\n(.*?)(?=^\[|^rule |\Z)", p.stdout, re.M | re.S)
    trains = [re.search(r"resources: (.*)", b).group(1) for b in jobs]
    assert len(trains) == EXAMPLES[name]
    for ln in trains:  # every run: all 8 GPUs of whole H100 nodes
        assert "gres=gpu:8" in ln and "constraint=h100" in ln and "--exclusive" in ln, ln
    multi = [ln for ln in trains if "nodes=4" in ln]
    assert multi and all("mpi=srun" in ln for ln in multi)
    # every job asks for memory from a stated estimate, none for Snakemake's 1,000 MB default:
    # exclusive ones the whole node (mem_mb 0: --mem=0), builds 2 GiB per compiler process
    blocks = re.findall(r"^(?:local)?rule (\w+):\n(.*?)(?=^\[|^(?:local)?rule |\Z)", p.stdout,
                        re.M | re.S)  # fmt: skip
    memory = {rule: re.search(r"resources: .*\bmem_mb=(\d+)", b).group(1) for rule, b in blocks}
    assert "1000" not in memory.values(), memory
    assert memory["train"] == memory["collectives"] == "0", memory
    assert int(memory["deepspeed_ops"]) == build_mem_mb(8), memory

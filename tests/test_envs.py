"""envs/*.yaml (conda) pin the same versions as requirements.txt (the .venv)."""

import re

import pytest

from conftest import ROOT, load_yaml


def pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)==([^\s;#]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


VENV = pins((ROOT / "requirements.txt").read_text().splitlines())


@pytest.mark.parametrize("env", sorted((ROOT / "envs").glob("*.yaml")), ids=lambda p: p.name)
def test_conda_env_pins_match_the_venv(env):
    deps = load_yaml(env)["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    conda_pins = pins(pip)
    assert conda_pins, f"{env.name} pins nothing"
    names = [str(d).split("==")[0].lower() for d in pip if "==" in str(d)]
    assert len(names) == len(set(names)), f"{env.name} pins a package twice: {sorted(names)}"
    for name, version in conda_pins.items():
        assert name in VENV, f"{env.name} pins {name} which requirements.txt does not"
        assert VENV[name] == version, f"{env.name}: {name}=={version}, venv has {VENV[name]}"
    assert "python=3.11" in deps


def test_torch_is_pinned_everywhere():
    assert VENV["torch"] == "2.13.0"


def test_horovod_env_builds_horovod_with_the_project_script():
    """No pip pin of horovod (its sdist does not build unedited): conda's post-deploy step runs
    the same scripts/build-horovod.sh as `make setup`, with the build tools the env brings."""
    deps = load_yaml(ROOT / "envs" / "horovod.yaml")["dependencies"]
    assert {"cmake", "make", "gxx_linux-64"} <= {d for d in deps if isinstance(d, str)}
    assert "horovod" not in VENV
    hook = (ROOT / "envs" / "horovod.post-deploy.sh").read_text()
    assert "scripts/build-horovod.sh" in hook
    assert "HOROVOD_VERSION=0.28.1" in (ROOT / "scripts" / "build-horovod.sh").read_text()
    assert {"cloudpickle", "packaging", "psutil", "pyyaml"} <= set(VENV)  # Horovod's runtime deps


def test_the_apptainer_definition_installs_the_pinned_requirements():
    """envs/trainscale.def (docs/gpu-cluster.md): Python 3.11, requirements.txt as pinned (the
    same file, copied in), DeepSpeed without prebuilt ops, Horovod by the project's script, and
    `python` on PATH for the launch line; its %files exist in the checkout."""
    text = (ROOT / "envs" / "trainscale.def").read_text()
    assert re.search(r"^Bootstrap: docker$", text, re.M) and "python3.11 -m venv" in text
    assert "DS_BUILD_OPS=0 pip install --no-cache-dir -r /opt/trainscale/requirements.txt" in text
    assert "build-horovod.sh /opt/trainscale/venv/bin/python" in text
    assert "ln -sf /opt/trainscale/venv/bin/python /usr/local/bin/python" in text
    # one CUDA stack: nvcc of torch's CUDA major, InfiniBand's verbs for NCCL, TensorFlow's
    # CUDA libraries, and the base image's NCCL left in place (Horovod takes torch's)
    from trainscale.gpu.stack import PINNED_TORCH_CUDA

    base = re.search(r"^From: nvidia/cuda:(\d+)\.\d+\.\d+-cudnn-devel-", text, re.M)
    assert base and base.group(1) == PINNED_TORCH_CUDA.split(".")[0], base
    assert "rdma-core" in text and "libibverbs1" in text and "[and-cuda]" in text
    assert "apt-get purge" not in text
    files = re.search(r"^%files\n(.*?)\n\n", text, re.M | re.S).group(1).split("\n")
    for line in files:
        src, _ = line.split()
        assert (ROOT / src).is_file(), src

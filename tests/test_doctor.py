"""`trainscale doctor`: one PASS/FAIL line per node, exit 1 when any fails; on this CPU machine
a cuda study fails naming why, a CPU study passes. (Through srun on the local cluster:
tests/test_slurm_affinity.py.)"""

import dataclasses

import pytest
import torch
import yaml

from trainscale.gpu import doctor
from trainscale.measure.node_state import GpuState

H100 = GpuState(0, "GPU-1", "NVIDIA H100 80GB HBM3", 700.0, 1980, [],
                {"corrected": 0, "uncorrected": 0}, None, 0)  # fmt: skip
NODE = doctor.NodeFacts("gpu07", "cuda", 64, 8, None, "580.65.06", "2.13.0", "13.0", 8, 8, [H100])


def test_a_node_passes_or_fails_with_the_reason():
    assert doctor.verdict(NODE).startswith("gpu07: PASS 8 × NVIDIA H100 80GB HBM3, driver 580")
    cpu_build = dataclasses.replace(NODE, torch_cuda=None, torch_devices=0)
    assert "gpu07: FAIL torch 2.13.0 is built without CUDA" in doctor.verdict(cpu_build)
    old = dataclasses.replace(NODE, driver="535.104.05", torch_devices=0)
    assert "driver 535.104.05" in doctor.verdict(old) and "CUDA 13.0" in doctor.verdict(old)
    few = dataclasses.replace(NODE, torch_devices=4)
    assert doctor.verdict(few) == "gpu07: FAIL torch sees 4 GPU(s), a cell needs 8 on one node"
    hot = dataclasses.replace(H100, throttle_reasons=["hw_thermal_slowdown"],
                              ecc_errors={"corrected": 0, "uncorrected": 2})  # fmt: skip
    line = doctor.verdict(dataclasses.replace(NODE, gpus=[hot]))
    assert "2 uncorrected ECC errors" in line and "hw_thermal_slowdown" in line
    assert doctor.verdict(dataclasses.replace(NODE, accelerator="cpu")).startswith(
        "gpu07: PASS cpu"
    )


def test_driver_against_torchs_cuda():
    assert doctor.driver_too_old("580.65.06", "13.0") is None
    assert doctor.driver_too_old("570.1", "13.0") == (
        "driver 570.1 is too old for CUDA 13.0, which needs driver 580.0.0 or newer"
    )
    assert doctor.driver_too_old("525.60.13", "12.8") is None
    assert doctor.driver_too_old(None, "13.0") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU machine's answers")
def test_on_this_cpu_machine(tmp_path, capsys):
    assert doctor.main([]) == 0
    assert ": PASS cpu: " in capsys.readouterr().out
    study = tmp_path / "cuda.yaml"
    matrix = {"strategy": ["torch"], "model": ["seed-small"], "dataset": ["digits"]}
    study.write_text(yaml.safe_dump({"study": "d", "accelerator": "cuda", "matrix": matrix}))
    assert doctor.main([str(study)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert ": FAIL " in line and "CUDA" in line
    srun = doctor.srun_line(doctor.asked_by(None), "py")
    assert srun[:3] == ["srun", "--nodes=1", "--ntasks-per-node=1"]


def test_setup_stops_where_torch_cannot_use_the_driver():
    from trainscale.gpu import stack

    assert stack.problems("580.65.06", "13.0", "2.13.0") == []
    (cpu,) = stack.problems("580.65.06", None, "2.13.0+cpu")
    assert "torch 2.13.0+cpu is a CPU build" in cpu
    (old,) = stack.problems("550.54.15", "13.0", "2.13.0")
    assert "driver 550.54.15 is too old for CUDA 13.0" in old and "torch 2.13.0" in old
    assert stack.installed("pyyaml") and not stack.installed("trainscale-no-such-distribution")


def test_setup_finds_torchs_cudnn_replaced_by_tensorflows_cuda_12_wheel(tmp_path):
    """nvidia-cudnn-cu12 (tensorflow[and-cuda]) and nvidia-cudnn-cu13 (torch) both install
    nvidia/cudnn/lib/libcudnn.so.9: a site-packages in the wheels' own format (dist-info
    METADATA and RECORD), where the file holds torch's bytes, then TensorFlow's."""
    import base64
    import hashlib
    import importlib.metadata

    from trainscale.gpu import stack

    lib = "nvidia/cudnn/lib/libcudnn.so.9"
    ours, theirs = b"cuDNN 9 for CUDA 13", b"cuDNN 9 for CUDA 12"

    def wheel(name: str, version: str, content: bytes) -> None:
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(
            f"{lib},sha256={digest},{len(content)}\n{info.name}/RECORD,,\n"
        )

    (tmp_path / lib).parent.mkdir(parents=True)
    (tmp_path / lib).write_bytes(ours)
    wheel("nvidia-cudnn-cu13", "9.19.0.56", ours)
    assert stack.replaced([str(tmp_path)]) == []
    wheel("nvidia-cudnn-cu12", "9.28.0.42", theirs)
    assert stack.replaced([str(tmp_path)]) == []  # torch's wheel was installed last
    (tmp_path / lib).write_bytes(theirs)  # tensorflow[and-cuda] after torch
    (line,) = stack.replaced([str(tmp_path)])
    assert line == f"{lib} is nvidia-cudnn-cu12's, not nvidia-cudnn-cu13 9.19.0.56's"
    # what make setup installs for TensorFlow instead: and-cuda's wheels but cuDNN and NCCL
    wheels = stack.tensorflow_cuda(importlib.metadata.requires("tensorflow"))
    assert "nvidia-cublas-cu12<13.0,>=12.5.3.2" in wheels and len(wheels) == 10
    assert not [w for w in wheels if w.startswith(("nvidia-cudnn", "nvidia-nccl", "tensorflow"))]
    # the wheel that tells TensorFlow's CUDA libraries installed (not the module nvidia.cudnn,
    # which torch's CUDA 13 wheels install too) is one of them
    assert [w for w in wheels if w.split("<")[0] == stack.TF_CUDA]

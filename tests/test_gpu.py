"""Every GPU path of `make gpu-check` as a test marked `gpu`: on a node with CUDA each runs its
path through the real launcher (trainscale.gpu.check) and must pass; without CUDA each is
skipped. tests/gpu_guard.py fails the session on a CUDA node where any of them did not run."""

from __future__ import annotations

import pytest

from trainscale.gpu import check as gpu_check

STATE, WHY = gpu_check.cuda_state()


@pytest.mark.parametrize(
    "path", [pytest.param(n, marks=pytest.mark.gpu(path=n), id=n) for n in gpu_check.names()]
)
def test_gpu_path(path, tmp_path):
    if STATE == "none":
        pytest.skip("no CUDA device")
    assert STATE == "cuda", WHY  # a driver torch cannot use is a failure, not a skip
    ctx = gpu_check.Context(out=tmp_path, first_gpu=gpu_check.first_visible_gpu())
    result = gpu_check.run_check(gpu_check.by_name(path), ctx)
    if result.verdict == gpu_check.NOT_INSTALLED and path in gpu_check.OPTIONAL:
        pytest.skip(f"not installed: {result.detail}")
    assert result.verdict == gpu_check.PASS, result.line()

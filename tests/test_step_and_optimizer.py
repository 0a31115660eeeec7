"""What a GPU step costs the runner, decided and tested on CPU (issue: no per-step host sync,
fused optimizers, tensor parallelism where ranks share a GPU, FSDP at one rank):

- the step timer's arithmetic (trainscale.runners.torch.step_timer) on a fake clock and fake
  CUDA events;
- config optimizer.fused: which implementation each device gets, that fused and the loop over
  tensors train the same weights, and that a run records its choice;
- the planner's drop of torch-tp, torch-fsdp-tp and torch-pipeline cells whose ranks would
  share a GPU;
- FSDP2's resharding: none over one rank, every unit but the last over several."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainscale.plan.machine import visible_gpus
from trainscale.plan.matrix import build_runs
from trainscale.runners.torch.step_timer import StepTimer
from trainscale.runners.torch.torch_parts import make_optimizer, optimizer_implementation

from conftest import validated


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeEvent:
    """torch.cuda.Event's timing, on a fake device clock: recorded at the clock's time, which
    the device reaches later than the host records it (the host queues ahead)."""

    def __init__(self, device_clock: FakeClock) -> None:
        self.clock, self.at = device_clock, None

    def record(self) -> None:
        self.at = self.clock()

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1000.0  # milliseconds, as CUDA's


def test_the_step_timer_reads_events_once_the_epoch_is_over():
    device = FakeClock()
    timer = StepTimer(torch.device("cuda"), event=lambda: FakeEvent(device))
    for seconds in (0.25, 0.5, 0.125):
        timer.step_starts()
        device.now += seconds  # the device's work of the step
        timer.step_ends()
        device.now += 1.0  # between steps: the next batch's copy, not the step's
    assert timer.seconds() == pytest.approx([0.25, 0.5, 0.125])
    assert timer.seconds() == []  # each epoch starts a new list
    timer.step_starts()
    with pytest.raises(RuntimeError, match="started and did not end"):
        timer.seconds()


def test_the_step_timer_uses_the_host_clock_on_cpu():
    clock = FakeClock()
    timer = StepTimer(torch.device("cpu"), clock=clock)
    assert timer.event is None
    for seconds in (2.0, 3.0):
        timer.step_starts()
        clock.now += seconds
        timer.step_ends()
    assert timer.seconds() == [2.0, 3.0]


def spec_of(**kw):
    m = {"strategy": [kw.pop("strategy", "torch")], "model": ["gpt-nano"],
         "dataset": ["shakespeare"], "seq_len": [32], "batch_size": [8],
         "workers": [kw.pop("workers", 1)], "tp": [kw.pop("tp", 1)]}  # fmt: skip
    cfg = validated({"study": "t", "optimizer": {"name": "adamw", **kw}, "matrix": m})
    return cfg


def test_fused_is_chosen_for_adam_on_cuda_and_where_asked():
    (auto,), _ = build_runs(spec_of())
    (on,), _ = build_runs(spec_of(fused=True))
    (off,), _ = build_runs(spec_of(fused=False))
    assert auto.fused == "auto" and on.fused is True and off.fused is False
    assert optimizer_implementation(auto, "cuda") == "fused"
    assert optimizer_implementation(auto, "cpu") == "for-loop"  # torch's default there
    assert optimizer_implementation(off, "cuda") == "foreach"
    assert optimizer_implementation(on, "cpu") == "fused"
    sgd = dataclasses.replace(auto, optimizer="sgd")
    assert optimizer_implementation(sgd, "cuda") == "foreach"  # auto: Adam and AdamW only
    with pytest.raises(Exception, match="fused"):
        validated({"study": "t", "optimizer": {"fused": "yes"},
                   "matrix": {"strategy": ["torch"]}})  # fmt: skip


def test_fused_and_the_loop_over_tensors_train_the_same_weights():
    """Three AdamW steps of a small net on CPU: fused (optimizer.fused true) and the loop
    (auto on CPU) agree to float32 rounding."""
    (auto,), _ = build_runs(spec_of(weight_decay=0.1))
    finals = []
    for spec in (auto, dataclasses.replace(auto, fused=True)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        opt = make_optimizer(spec, net.parameters())
        assert bool(opt.defaults["fused"]) is (spec.fused is True)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            x = torch.randn(8, 16, generator=g)
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
        finals.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-5, atol=1e-6)


def test_cells_whose_ranks_would_share_a_gpu_are_dropped_with_the_reason():
    cfg = validated({"study": "t", "matrix": {
        "strategy": ["torch-tp", "torch-fsdp-tp", "torch-pipeline", "torch-ddp"],
        "model": ["gpt-nano"], "dataset": ["shakespeare"], "seq_len": [32],
        "batch_size": [8], "workers": [1, 2, 4], "tp": [1, 2, 4]}})  # fmt: skip
    runs, dropped = build_runs(cfg, "cuda", gpus_per_node=2)
    shared = {(d.values["strategy"], d.values["workers"]): d.reason for d in dropped
              if "a rank needs one of its own" in d.reason}  # fmt: skip
    assert set(shared) == {("torch-tp", 4), ("torch-fsdp-tp", 4), ("torch-pipeline", 4)}
    runs, dropped = build_runs(cfg, "cuda", gpus_per_node=1)
    shared = {(d.values["strategy"], d.values["workers"]): d.reason for d in dropped
              if "a rank needs one of its own" in d.reason}  # fmt: skip
    assert "DTensor's collectives over gloo" in shared[("torch-tp", 2)]
    assert "use workers up to 1 per node" in shared[("torch-tp", 2)]
    assert ("torch-ddp", 2) in {(r.strategy, r.workers) for r in runs}  # gloo shares a GPU
    for accelerator, gpus in (("cuda", 4), ("cuda", None), ("cpu", 1)):
        _, dropped = build_runs(cfg, accelerator, gpus_per_node=gpus)
        assert not [d for d in dropped if "a rank needs one of its own" in d.reason], gpus


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    from trainscale.plan import machine

    monkeypatch.setattr(machine, "gpu_count", lambda: 8)
    assert visible_gpus({}) == 8
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3"}) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0


@pytest.mark.parametrize("world", [1, 2])
def test_fsdp_reshards_no_unit_at_one_rank_and_all_but_the_last_at_more(world):
    """gpt-nano sharded by the runner's own `shard` over a fake process group: after forward a
    unit keeps its gathered parameters where it does not reshard (FSDP2's post-forward mesh
    is then None)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainscale.models import torch_models
    from trainscale.runners.torch.pytorch import shard, shard_units

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        net = torch_models.build("gpt-nano", (32,), 65, seed=0, meta=True)
        units = shard_units(torch_models.blocks(net))
        shard(net, None)
        reshards = [u[0]._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None
                    for u in units]  # fmt: skip
    finally:
        dist.destroy_process_group()
    # the units: the tied embedding and head (first in shard_units, last to run), the blocks
    assert len(units) == 5 and len(units[0]) == 2
    assert reshards == ([False] * 5 if world == 1 else [False, True, True, True, True])

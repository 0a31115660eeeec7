"""Tensor parallelism: `torch-tp` (every layer split over all ranks) and `torch-fsdp-tp` (a 2-D
mesh, FSDP2 over its `dp` dimension and tensor parallelism over its `tp` dimension, as
torchtitan lays a model out: FSDP across nodes, TP inside one). Launched by torchrun like
torch-ddp; a plug-in on the PyTorch loop (torch_loop.py), which trains, times and records it.

The ranks of one `tp` group are one data-parallel replica: they feed the same batch (the
loop's data order by replica, `data_rank`), compute the same loss and hold one split model;
the dp replicas read disjoint batches. The plan itself is in tp_plans.py. The model's logits
stay split by vocabulary (a DTensor, each rank's share): the loop's loss is computed on the
shares (tp_loss, in one copy of a share where `loss_parallel` keeps four), and evaluation
scores them where they lie (tp_plans.token_scores).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from trainscale.models import torch_models as models
from trainscale.models.init import on_meta
from trainscale.plan import catalog
from trainscale.plan.matrix import RunSpec
from trainscale.runners.torch import tp_plans
from trainscale.runners.torch.plugin import Plugin
from trainscale.runners.torch.pytorch import compile_blocks, materialise, shard
from trainscale.runners.torch.torch_loop import run

# FSDP2 warns on every forward that a unit returned a view (DTensor's to_local of a
# redistributed output); the loop never changes a block's output in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

#: process-group backends with the collectives sequence parallelism needs (all-gather and
#: reduce-scatter of DTensors; gloo has both in torch 2.13: tests/test_tensor_parallel.py)
SEQUENCE_PARALLEL_BACKENDS = ("nccl", "gloo")


class TensorParallel(Plugin):
    """A `dp` × `tp` DeviceMesh (dp = 1 for torch-tp): the model split over `tp` by its plan,
    and for torch-fsdp-tp each block sharded over `dp` as torch-fsdp shards it."""

    def connect(self, device: torch.device) -> None:
        if device.type == "cuda" and self.loop.backend != "nccl":
            # the planner drops such cells where it knows the node's GPUs (catalog
            # gpu_per_rank); a run launched onto a node of fewer GPUs ends here, with the reason,
            # instead of in a SIGSEGV inside DTensor's first all-gather
            raise RuntimeError(
                f"{self.spec.strategy}: {self.loop.rk.local_world_size} ranks share "
                f"{torch.cuda.device_count()} GPU(s) on this node, and a rank needs one of its "
                f"own: {catalog.STRATEGIES[self.spec.strategy].gpu_per_rank}; use workers up "
                "to the node's GPUs"
            )
        super().connect(device)
        self.tp = self.spec.tp
        self.dp = self.loop.rk.world_size // self.tp
        self.mesh = init_device_mesh(device.type, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
        self.dp_group = self.mesh["dp"].get_group()

    def data_rank(self) -> tuple[int, int]:
        """A tp group's ranks are consecutive (the mesh is row-major): one replica."""
        return self.loop.rk.rank // self.tp, self.dp

    def build(self) -> torch.nn.Module:
        """On the meta device where the model initialises module by module (the GPT family,
        `hf:` models, own models with `init`): split and sharded before any storage."""
        return self.loop.build_model(meta=True)

    def wrap(self, net: torch.nn.Module) -> None:
        lp, spec = self.loop, self.spec
        self.eval_model = self.net = net if on_meta(net) else net.to(lp.device)
        blocks = models.blocks(net, spec.own_model)
        self.sequence_parallel = tp_plans.parallelize(
            net, self.mesh["tp"], blocks, spec.own_model,
            sequence_parallel=lp.backend in SEQUENCE_PARALLEL_BACKENDS,
        )  # fmt: skip
        if spec.strategy == "torch-fsdp-tp":  # torch-fsdp's units over the dp dimension
            shard(net, self.dtype, spec.compile, spec.own_model, mesh=self.mesh["dp"])
            self.dtype = None  # FSDP casts parameters and inputs itself: no autocast
        elif spec.compile:  # each block after the split, as torchtitan compiles
            compile_blocks(blocks)
        materialise(net, lp.device, spec)
        self.model = net
        self.opt = lp.make_optimizer(net.parameters())
        self.scaler = torch.amp.GradScaler(lp.device.type, enabled=False)  # no fp16 (catalog)

    def replica_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Over the dp replicas only: a tp group's ranks score the same batches."""
        if self.dp > 1:
            dist.all_reduce(t, group=self.dp_group)
        return t

    def finish(self) -> None:
        spec = self.spec
        self.extra_blocks["tp"] = {
            "degree": self.tp,
            "data_parallel": self.dp,
            "sequence_parallel": self.sequence_parallel,
            "plan": spec.own_model.tp_plan if spec.own_model else "gpt",
        }
        self.env_extra["mesh"] = {"dp": self.dp, "tp": self.tp}


def main(spec: RunSpec, out: str) -> None:
    run(TensorParallel, spec, out)

"""Horovod with PyTorch: `horovod-torch` (hvd.DistributedOptimizer, ring all-reduce) and
`horovod-torch-elastic` (the same loop under hvd.elastic.run: workers may leave or join).

Started by `horovodrun` (gloo on CPU, NCCL/MPI where the build has them), one process per
worker. A plug-in on the PyTorch loop (torch_loop.py), in Horovod's own recipe: rank
from `hvd.init()`, the gradient average in `hvd.DistributedOptimizer`, initial parameters and
optimizer state broadcast from rank 0, metrics reduced with `hvd.allreduce`, rank 0 writes.
Same data shards (DistributedSampler), model, hyper-parameters and steps per epoch as
`torch-ddp`.

Horovod's `broadcast_optimizer_state` initialises an empty optimizer state by one step with
zero gradients (so Adam's step count starts at 1, not 0): that is what every Horovod program
does, so it is kept; it moves no weight (zero gradient, and weight decay aside).

Elastic: the state (model, optimizer, epoch, the epoch records so far and the membership log)
is committed after every epoch. When the host discovery script reports fewer or more slots,
the workers stop at the next commit, Horovod re-forms the ring and the run goes on with the
new world size: the *global* batch stays the spec's (each worker takes global / size), so the
optimisation is unchanged. A worker that dies mid-epoch costs that epoch: the state rolls back
to the last commit and the epoch runs again. Each change lands in the metrics'
`horovod.elastic.membership`.
"""

from __future__ import annotations

import os

import horovod
import horovod.torch as hvd
import torch

from trainscale.data import tokendata
from trainscale.measure import metrics
from trainscale.plan.matrix import RunSpec
from trainscale.runners.common import Rank
from trainscale.runners.device_check import require_nccl
from trainscale.runners.torch.exposed import block, measure_exposed_communication, replica_skipped
from trainscale.runners.torch.plugin import Plugin, Shard
from trainscale.runners.torch.torch_loop import run
from trainscale.runners.torch.torch_parts import make_optimizer
from trainscale.runners.torch.torch_speed import compiled


class Horovod(Plugin):
    """hvd.DistributedOptimizer around the model's optimizer; Horovod's collectives."""

    def rank(self) -> Rank:
        hvd.init()
        self.frameworks = {"horovod": horovod.__version__}
        return Rank(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())

    def connect(self, device: torch.device) -> None:
        self.loop.backend = None  # Horovod's own controller and ops, not torch.distributed
        self.elastic = self.spec.strategy == "horovod-torch-elastic"
        require_nccl(self.spec.accelerator, bool(hvd.nccl_built()), hvd.rank())
        if not self.elastic and hvd.size() != self.spec.world_size:
            raise RuntimeError(
                f"horovodrun started {hvd.size()} workers, the run needs {self.spec.world_size}"
            )

    def barrier(self) -> None:
        hvd.barrier()

    # on host tensors: a Horovod built without GPU operations reduces those only
    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(t.cpu(), op=hvd.Sum).to(t.device)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return hvd.allgather(t.cpu().unsqueeze(0)).to(t.device)

    def gather_object(self, obj: object) -> list:
        return hvd.allgather_object(obj)

    @property
    def world_size(self) -> int:
        return hvd.size()  # an elastic run's current size

    @property
    def device_count(self) -> int:
        return hvd.size()

    def wrap(self, net: torch.nn.Module) -> None:
        lp = self.loop
        self.eval_model = self.net = net.to(lp.device)
        self.step_net = compiled(net, self.spec)
        self.model = self.step_net  # what Plugin.backward runs
        self.opt = hvd.DistributedOptimizer(
            lp.make_optimizer(net.parameters()),
            named_parameters=net.named_parameters(),
            op=hvd.Average,
            backward_passes_per_step=self.spec.grad_accum,  # all-reduced after the last
        )
        self.scaler = torch.amp.GradScaler(lp.device.type, enabled=self.spec.precision == "fp16")

    def shard(self, epoch: int) -> Shard:
        """This rank's shard at the current world size: the global batch stays the spec's."""
        lp = self.loop
        rk = lp.rk = Rank(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
        b = self.spec.global_batch_size // rk.world_size
        if lp.tokens:  # this rank's windows at the current size (an elastic run's may change)
            w = lp.loader.windows
            if (w.rank, w.world, w.batch) != (rk.rank, rk.world_size, b):
                lp.loader, lp.test_loader = tokendata.loaders(self.spec, rk.rank, rk.world_size, b)
            return Shard(None, b, min(lp.steps, lp.loader.steps), b * rk.world_size)
        shard = super().shard(epoch)
        steps = min(self.loop.steps, len(shard.order) // b)
        return Shard(shard.order, b, steps, b * rk.world_size)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Plugin.step's accumulation with Horovod's optimizer: its hooks count the backward
        passes (backward_passes_per_step) and all-reduce after the step's last."""
        k = self.spec.grad_accum
        self.opt.zero_grad()  # Horovod's takes no set_to_none; None is torch's default
        micro = zip(x.tensor_split(k), y.tensor_split(k), strict=True) if k > 1 else [(x, y)]
        loss = sum(self.backward(xm, ym, len(ym) / len(y) * k) for xm, ym in micro)
        if self.scaler.is_enabled():  # fp16: Horovod's AMP recipe
            self.opt.synchronize()  # all-reduce first, then unscale and step
            with self.skips.counting(self.scaler):
                with self.opt.skip_synchronize():
                    self.scaler.step(self.opt)
                self.scaler.update()
        else:
            self.opt.step()
        return loss

    def train(self) -> None:
        if self.elastic:
            self.membership = train_elastic(self)
            return
        hvd.broadcast_parameters(self.net.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.opt, root_rank=0)
        super().train()

    def exposed(self, shard: Shard) -> dict:
        lp = self.loop
        if why := replica_skipped(self.spec):
            return block(lp.rec.epochs, None, None, skipped=why)
        replica = lp.build_model().to(lp.device)
        k = self.spec.grad_accum
        return measure_exposed_communication(
            "replica", lp.rec.epochs, compiled(replica, self.spec),
            make_optimizer(self.spec, replica.parameters()),  # not the run's: unrecorded
            lp.sample_batches(shard.batch // k), lp.device,
            self.dtype, self.scaler, grad_accum=k,
        )  # fmt: skip

    def finish(self) -> None:
        hv = {"timeline": os.environ.get("HOROVOD_TIMELINE"), "final_world_size": hvd.size()}
        if self.elastic:
            hv["membership"] = self.membership
        self.extra_blocks = {"horovod": hv}

    def teardown(self) -> None:
        hvd.shutdown()


def train_elastic(plugin: Horovod) -> list[dict]:
    """hvd.elastic.run over the epochs: commit after each, log every change of membership."""
    loop = plugin.loop
    state = hvd.elastic.TorchState(
        plugin.net, plugin.opt, epoch=1, history=[], membership=[], test=loop.test
    )

    @hvd.elastic.run
    def train(state) -> None:
        # state was just synced from rank 0: every rank holds the same records
        loop.rec.epochs = [dict(e) for e in state.history]
        loop.test = dict(state.test)
        if not state.membership or state.membership[-1]["world_size"] != hvd.size():
            state.membership.append(
                {"after_epoch": state.epoch - 1, "world_size": hvd.size(), "utc": metrics.utc_now()}
            )
            if hvd.rank() == 0:
                print(f"horovod elastic: {hvd.size()} workers from epoch {state.epoch}", flush=True)
        while state.epoch <= loop.spec.epochs:
            if loop.epoch(state.epoch) is None:
                return  # diverged: every rank saw it in the same all-reduced losses
            state.history = [dict(e) for e in loop.rec.epochs]
            state.test = dict(loop.test)
            state.epoch += 1
            state.commit()  # a save point; also where a change of hosts interrupts

    train(state)
    return state.membership


def main(spec: RunSpec, out: str) -> None:
    run(Horovod, spec, out)

"""What every runner shares: rank detection, the thread budget, the data shard, timing."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from trainscale import metrics


@dataclass(frozen=True)
class Rank:
    """This process's place in the job, as the launcher's environment states it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def detect_rank(environ: dict[str, str] | None = None) -> Rank:
    """Rank as the launcher states it: torchrun (RANK...) or Open MPI/Horovod (OMPI_*)."""
    env = os.environ if environ is None else environ
    for rank, world, local, local_world in (
        ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
    ):
        if rank in env:
            w = int(env.get(world, "1"))
            return Rank(int(env[rank]), w, int(env.get(local, "0")), int(env.get(local_world, w)))
    return Rank(0, 1, 0, 1)


def check_oversubscribed(workers_per_node: int, threads_per_worker: int) -> bool:
    """Whether this node's workers together ask for more threads than it has cores."""
    return metrics.oversubscribed(workers_per_node, threads_per_worker, metrics.cpu_count())


def steps_per_epoch(train_samples: int, world_size: int, per_worker_batch: int) -> int:
    """Optimizer steps per epoch: the same on every rank (DistributedSampler with drop_last
    gives equal shards), so every rank stops after the same step and no collective hangs."""
    return (train_samples // world_size) // per_worker_batch


def check_steps(steps: int, spec_path: str, train_samples: int, global_batch: int) -> None:
    if steps < 1:
        raise ValueError(
            f"{spec_path}: the global batch ({global_batch}) is larger than one epoch "
            f"({train_samples} samples): use a smaller batch_size or a larger scale"
        )


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}" if math.isfinite(x) else str(x)

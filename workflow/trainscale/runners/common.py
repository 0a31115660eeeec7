"""What every runner shares: rank detection, the thread budget, the data shard, timing."""

from __future__ import annotations

import math
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass

from trainscale.measure import metrics
from trainscale.plan.matrix import RunSpec


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


def steps_per_epoch(
    train_samples: int, world_size: int, per_worker_batch: int, limit: int | None = None
) -> int:
    """Optimizer steps per epoch: the same on every rank (DistributedSampler with drop_last
    gives equal shards), so every rank stops after the same step and no collective hangs.
    `limit` (config `steps_per_epoch`) cuts every epoch to its first `limit` steps, so that
    every strategy times the same number of steps; None runs the whole data set."""
    full = (train_samples // world_size) // per_worker_batch
    return full if limit is None else min(full, limit)


def evaluates(spec: RunSpec, synthetic: bool, epoch: int) -> bool:
    """Whether the test set is scored after `epoch`: never on synthetic data (random labels,
    accuracy means nothing) nor in a run whose spec says `evaluate: false` (a tune's: it times
    steps only), else after every epoch when time-to-accuracy is asked for
    (`target_accuracy`), and after the last one."""
    if synthetic or not spec.evaluate:
        return False
    return spec.target_accuracy is not None or epoch == spec.epochs


def check_steps(steps: int, spec_path: str, train_samples: int, global_batch: int) -> None:
    if steps < 1:
        raise ValueError(
            f"{spec_path}: the global batch ({global_batch}) is larger than one epoch "
            f"({train_samples} samples): use a smaller batch_size or a larger scale"
        )


def record_epoch(
    rec: metrics.Recorder,
    spec: RunSpec,
    epoch: int,
    seconds: float,
    steps: int,
    train_loss: float,
    step_seconds: list[float],
    test: tuple[float | None, float | None] | None,
    main: bool,
) -> dict:
    """Record epoch `epoch` in `rec` and, on the main rank, print its progress line: one
    piece for every framework's loop, so each records the same figures. `test` is the
    (accuracy, loss) of this epoch's evaluation, None where it did not evaluate."""
    accuracy, loss = test if test is not None else (None, None)
    e = rec.epoch(
        seconds,
        samples=steps * spec.global_batch_size,
        steps=steps,
        train_loss=train_loss,
        step_seconds=step_seconds,
        test_accuracy=accuracy,
        test_loss=loss,
    )
    if main:
        print(
            f"epoch {epoch}/{spec.epochs}: {seconds:.3f} s, "
            f"{fmt_rate(e['samples_per_second'])} samples/s, loss {train_loss:.4f}",
            flush=True,
        )
    return e


def write_ok(out: str, result: dict, accuracy: object) -> None:
    """Write a finished run's record and say so on stdout: the last line of every loop. A
    diverged run (trainscale.measure.divergence) ends here too: its record is its result."""
    metrics.write(out, result)
    if result["status"] == "diverged":
        print(f"trainscale: diverged: {result['error']}; wrote {out}", flush=True)
        return
    throughput = result["throughput"]
    print(
        f"trainscale: ok, throughput {fmt_rate(throughput)} samples/s, "
        f"test accuracy {accuracy}; wrote {out}",
        flush=True,
    )


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}" if math.isfinite(x) else str(x)


def maybe_fault(spec: RunSpec, rank: int, epoch: int) -> None:
    """Cause the run's injected fault (config `faults`) if this is its rank and epoch. Every
    runner calls this half-way through each epoch, so the fault strikes mid-epoch, between
    collectives, as real ones do."""
    f = spec.fault
    if f is None or f.kind == "diverge" or f.part or f.rank != rank or f.epoch != epoch:
        return  # a planted divergence is the spec's learning rate (plan.runspec.DIVERGE_LR);
        # a fault in a part after training raises there (trainscale.runners.guarded)
    print(f"trainscale: injecting fault {f.kind!r} on rank {rank} in epoch {epoch}", flush=True)
    if f.kind == "raise":
        raise RuntimeError(f"injected fault: rank {rank} raised in epoch {epoch}")
    if f.kind == "kill":  # as when the node is lost: no exception, no clean-up
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "hang":  # the other ranks wait in their next collective until the timeout
        while True:
            time.sleep(3600)
    if f.kind == "oom":
        exhaust_memory()


def exhaust_memory() -> None:
    """Allocate past the memory there is: past free device memory on a GPU (PyTorch raises
    torch.OutOfMemoryError), else past a cap on this process's address space (RLIMIT_AS, set
    here to its current size + 256 MiB) so the host is never really exhausted (MemoryError)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        torch.empty(free + 2**30, dtype=torch.uint8, device="cuda")
    import numpy as np
    import psutil

    cap = psutil.Process().memory_info().vms + 2**28
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    np.ones(2**29, dtype=np.uint8)  # 512 MiB: past the cap
    raise MemoryError("allocated past RLIMIT_AS without an error")  # not reached

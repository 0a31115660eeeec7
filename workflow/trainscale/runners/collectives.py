"""The all-reduce microbenchmark (the `collectives` rule, `trainscale collectives`): how fast
the study's workers can sum a gradient, by message size.

    python -m trainscale.runners.collectives --backend gloo --workers 2 --nodes 1 \
        --model seed-small:digits --out FILE

It starts itself under torchrun (the same launch form as torch-ddp: srun across SLURM nodes);
every rank times `all_reduce` at each size and rank 0 writes one JSON with every raw timing.
The record and every figure in it (message size, time, algbw, busbw) are defined in
trainscale.measure.collectives, with nccl-tests' definitions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainscale.measure.collectives import (
    DTYPE_BYTES,
    SCHEMA_ID,
    bus_factor,
    planned_sizes,
    summarise,
)


def gradient_bytes(pairs: list[str]) -> int:
    """The largest gradient (parameters × 4 bytes) of `model:dataset` pairs (dataset: a name,
    or imagesets.shape_name's C×H×W×classes), built on the meta device (no memory, no time),
    or `params=N` for a user's own model."""
    import torch

    from trainscale.data import imagesets
    from trainscale.models import torch_models as models

    largest = 0
    for pair in pairs:
        if pair.startswith("params="):  # the user's own model, counted by its pre-flight
            largest = max(largest, int(pair.removeprefix("params=")) * DTYPE_BYTES)
            continue
        model, _, dataset = pair.partition(":")
        info = imagesets.info_of(dataset)  # a data set's name, or C×H×W×classes
        with torch.device("meta"):
            net = models.build(model, info.shape, info.num_classes)
        largest = max(largest, models.param_count(net) * DTYPE_BYTES)
    return largest


@dataclass(frozen=True)
class Sweep:
    """What `launch.torchrun` needs to know about a job: its shape and a stable id."""

    study: str
    workers: int
    nodes: int
    strategy: str = "collectives"
    threads_per_worker: int = 1  # each rank's threads: srun asks for a node's (--cpus-per-task)
    loader_workers: int = 0
    accelerator: str = "cpu"  # torchrun's one task a node takes the node's GPUs whole

    @property
    def path(self) -> str:
        return f"collectives/workers~{self.workers}/nodes~{self.nodes}"

    @property
    def processes(self) -> int:
        """One process per worker on every node (as RunSpec.processes for a training run)."""
        return self.workers * self.nodes

    @property
    def world_size(self) -> int:
        return self.processes


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Supervisor: start this module under torchrun with the same arguments, on the nodes of
    the SLURM allocation where there is one. A benchmark that cannot run (no GPUs for nccl, a
    crash, its timeout) still ends with a file: a `failed` record with the reason, so the
    study's tables and report are built around it. Exit 0 either way."""
    import dataclasses
    import signal

    from trainscale.launch import supervise as launch

    sweep = Sweep(args.study, args.workers, args.nodes, threads_per_worker=args.threads)
    env = launch.in_allocation(launch.detect(), sweep)
    if env.mode == "slurm" and args.nodes > 1 and not env.port:
        env = dataclasses.replace(env, port=launch.free_port())
    threads = str(args.threads)
    variables = {**dict(env.variables), "MKL_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
    prefix = ["env", *(f"{k}={v}" for k, v in sorted(variables.items()))]
    rank = ["-m", "trainscale.runners.collectives", *argv]
    cpus = args.workers * args.threads
    cmd = launch.in_image(env, prefix, cpus, lambda e: launch.torchrun(sweep, e, rank))
    print("trainscale.runners.collectives: launching:", " ".join(cmd), flush=True)
    out = Path(args.out)
    out.unlink(missing_ok=True)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=args.timeout_minutes * 60)
        why = f"the benchmark exited with code {proc.returncode} before writing its results"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        why = f"timeout: no result after {args.timeout_minutes:g} minutes; stopped"
    print(output, end="", flush=True)
    if not out.exists():
        lines = output.splitlines(keepends=True)
        causes = launch.exception_lines(lines)[:3]
        error = "\n".join([why, *causes, "--- last lines ---", "".join(lines[-20:])])
        write(out, failure(args, env.job_id, error, hosts=[]))
        print(f"trainscale.runners.collectives: recorded the failure in {out}", flush=True)
    return 0


def failure(args: argparse.Namespace, job_id: str | None, error: str, hosts: list) -> dict:
    """The record of a benchmark that did not measure: its shape, where it ran, and why."""
    return {
        "schema": SCHEMA_ID,
        "status": "failed",
        "error": error,
        "collective": "all_reduce",
        "backend": args.backend,
        "workers": args.workers,
        "nodes": args.nodes,
        "world_size": args.workers * args.nodes,
        "rank_hosts": hosts,
        "env": {"hostnames": sorted(set(hosts)), "slurm_job_id": job_id},
        "sizes": [],
    }


def write(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, out)


def worker(args: argparse.Namespace) -> None:
    """One rank: time all_reduce at every size; rank 0 writes the JSON.

    The ranks first meet over gloo (the control group: every rank's host and GPUs), so that a
    benchmark that cannot run on these nodes (nccl without a GPU for every rank) is recorded
    with where it ran; an nccl benchmark then times its own nccl group."""
    import torch
    import torch.distributed as dist

    from trainscale.measure import metrics
    from trainscale.runners.common import detect_rank
    from trainscale.runners.torch.torch_parts import leave, rank_device

    rk = detect_rank()
    torch.set_num_threads(args.threads)
    nccl = args.backend == "nccl"
    cuda = nccl or args.device == "cuda"
    dist.init_process_group(backend="gloo")
    # the GPU a training rank of this shape takes; nccl needs one of each rank's own, gloo's
    # CUDA tensors may share one (as two ranks of `make gpu-check` do on a one-GPU machine)
    gpu, shared = rank_device(rk.local_rank, rk.local_world_size)
    has_gpu = gpu.type == "cuda" and not (nccl and shared)
    seen: list = [None] * rk.world_size
    dist.all_gather_object(seen, (metrics.hostname(), has_gpu))
    hosts = [h for h, _ in seen]
    if cuda and not all(g for _, g in seen):
        if rk.is_main:
            without = sorted({h for h, g in seen if not g})
            need = "a GPU for every rank" if nccl else "a GPU for CUDA tensors"
            error = (
                f"backend {args.backend} needs {need}; no usable GPU on {', '.join(without)} "
                "(CUDA not available to this process, or fewer GPUs than workers)"
            )
            write(Path(args.out), failure(args, os.environ.get("SLURM_JOB_ID"), error, hosts))
            print(f"trainscale.runners.collectives: {error}", flush=True)
        leave()
    device = gpu if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    group = dist.new_group(backend="nccl") if nccl else None

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    largest = gradient_bytes(args.model) if args.model else None
    series, cut_short = planned_sizes(largest, args.max_bytes or None)
    max_bytes = largest if largest is not None and not cut_short else series[-1]
    rows = []
    for size in series:
        buf = torch.zeros(size // DTYPE_BYTES, dtype=torch.float32, device=device)
        times = []
        for _ in range(args.warmup + args.iters):
            dist.barrier(group=group)
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=group)
            sync()
            times.append(time.perf_counter() - t0)
        slowest = torch.tensor(times[args.warmup :], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the collective ends with its last rank
        rows.append(summarise(size, slowest.tolist(), rk.world_size))
        if rk.is_main:
            r = rows[-1]
            print(
                f"{size:>12} B  p50 {r['p50_seconds'] * 1e6:10.1f} us  "
                f"busbw {r['busbw_bytes_per_second'] / 1e9:8.3f} GB/s",
                flush=True,
            )
    if rk.is_main:
        record = {
            "schema": SCHEMA_ID,
            "status": "ok",
            "error": None,
            "collective": "all_reduce",
            "backend": args.backend,
            "workers": args.workers,
            "nodes": args.nodes,
            "world_size": rk.world_size,
            "dtype": "float32",
            "warmup": args.warmup,
            "iters": args.iters,
            "threads_per_worker": args.threads,
            "max_bytes": max_bytes,
            "gradient_bytes": largest,
            "cut_short": cut_short,
            "models": args.model,
            "bus_factor": bus_factor(rk.world_size),
            "rank_hosts": hosts,
            "device": {
                "kind": device.type,
                "name": torch.cuda.get_device_name(device) if cuda else metrics.cpu_name(),
            },
            "env": {
                "hostnames": sorted(set(hosts)),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "torch": torch.__version__,
                "utc": metrics.utc_now(),
            },
            "sizes": rows,
        }
        write(Path(args.out), record)
        print(f"trainscale.runners.collectives: wrote {args.out}", flush=True)
    leave()  # without the gloo teardown that can deadlock at exit


def parser(prog: str = "trainscale collectives") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__
    )
    p.add_argument(
        "--backend", choices=["gloo", "nccl"], default="gloo", help="default: %(default)s"
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where the reduced tensors live: cuda for nccl (always), cpu for gloo unless "
        "cuda is given (gloo reduces CUDA tensors too, as DDP over gloo on GPUs does)",
    )
    p.add_argument("--workers", type=int, required=True, help="ranks per node")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--model", action="append", default=[], help="model:dataset (repeatable)")
    p.add_argument(
        "--max-bytes", type=int, default=0, help="largest size, if below the models' gradient"
    )
    p.add_argument("--warmup", type=int, default=5, help="untimed repeats per size")
    p.add_argument("--iters", type=int, default=20, help="timed repeats per size")
    p.add_argument("--study", default="study", help="for the rendezvous id")
    p.add_argument("--timeout-minutes", type=float, default=10.0, help="the benchmark's time limit")
    p.add_argument("--out", required=True, help="the JSON record to write")
    return p


def main(argv: list[str] | None = None, prog: str = "trainscale collectives") -> int:
    """`trainscale collectives`: supervise the benchmark, or (under torchrun) be one rank."""
    argv = sys.argv[1:] if argv is None else argv
    p = parser(prog)
    args = p.parse_args(argv)
    if not args.model and not args.max_bytes:
        p.error("give --model model:dataset (one or more) or --max-bytes")
    if args.backend == "nccl" and args.device == "cpu":
        p.error("--backend nccl reduces CUDA tensors only: drop --device cpu")
    if "RANK" in os.environ:  # started by torchrun
        worker(args)
        return 0
    return run(args, argv)


if __name__ == "__main__":
    sys.exit(main(prog="python -m trainscale.runners.collectives"))

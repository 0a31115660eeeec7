"""All-reduce microbenchmark: how fast the study's workers can sum a gradient, by message size.

The `collectives` rule runs it once per (backend, workers, nodes) of the study:
`python -m trainscale.collectives --backend gloo --workers 2 --nodes 1 --model seed-small:digits
--out FILE` starts itself under torchrun (the same launch form as torch-ddp: srun across SLURM
nodes) and rank 0 writes one JSON with every raw timing. The definitions are nccl-tests' own
(its doc/PERFORMANCE.md), so the numbers compare with nccl-tests output:

- message size S: bytes of the fp32 tensor every rank contributes and receives summed; the
  sizes are the powers of 2 from 1 KiB up to the first one at or above the largest gradient of
  the study's models (parameters × 4 bytes). `--max-bytes` (config `collectives.max_bytes`)
  cuts the series short at the largest power of 2 at or below it when that is smaller; the
  record then says `cut_short: true`, and the communication model reads bandwidths above it
  from the largest size measured.
- time t: for each repeat, a barrier starts every rank together, then the wall-clock seconds
  of one `all_reduce` (device synchronised) until the slowest rank returns (the max over ranks
  of each rank's time). `warmup` untimed repeats come first, then `iters` timed ones; t_p50 and
  t_p95 are percentiles over the timed repeats (linear interpolation).
- algorithm bandwidth: algbw = S / t in bytes/s (from t_p50; from t_p95 for the slow tail).
- bus bandwidth: busbw = algbw · 2(n − 1)/n for n ranks: what each rank's link carries per
  second in a ring all-reduce (each rank sends and receives 2(n − 1)/n · S bytes), so it is
  comparable across n and with the link's rated speed.
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

SCHEMA_ID = "trainscale.collectives/1"
MIN_BYTES = 1024
DTYPE_BYTES = 4  # fp32, the dtype DDP reduces gradients in


def sizes(max_bytes: int, min_bytes: int = MIN_BYTES) -> list[int]:
    """Powers of 2 from `min_bytes` up to the first at or above `max_bytes`."""
    out = [min_bytes]
    while out[-1] < max_bytes:
        out.append(out[-1] * 2)
    return out


def planned_sizes(gradient: int | None, cap: int | None) -> tuple[list[int], bool]:
    """The message sizes to time, and whether `cap` cut them short of the largest gradient:
    up to the first power of 2 covering `gradient`, or only up to `cap` (the largest power of 2
    at or below it) when that comes first."""
    if cap is None or (gradient is not None and sizes(gradient)[-1] <= cap):
        return sizes(gradient), False
    below = [s for s in sizes(cap) if s <= cap] or [MIN_BYTES]
    return below, gradient is not None


def bus_factor(n: int) -> float:
    """Ring all-reduce traffic per rank in units of S: 2(n − 1)/n."""
    return 2 * (n - 1) / n


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), as metrics.percentile."""
    from trainscale.metrics import percentile as pct

    return pct(values, q)


def summarise(size: int, seconds: list[float], n: int) -> dict:
    """One message size's row: the raw timings and the figures defined in the docstring."""
    p50, p95 = percentile(seconds, 50), percentile(seconds, 95)
    return {
        "bytes": size,
        "seconds": seconds,
        "p50_seconds": p50,
        "p95_seconds": p95,
        "algbw_bytes_per_second": size / p50,
        "busbw_bytes_per_second": size / p50 * bus_factor(n),
        "algbw_p95_bytes_per_second": size / p95,
        "busbw_p95_bytes_per_second": size / p95 * bus_factor(n),
    }


def gradient_bytes(pairs: list[str]) -> int:
    """The largest gradient (parameters × 4 bytes) of `model:dataset` pairs, built on the meta
    device (no memory, no time)."""
    import torch

    from trainscale import data, models

    largest = 0
    for pair in pairs:
        model, _, dataset = pair.partition(":")
        info = data.info(dataset)
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

    @property
    def path(self) -> str:
        return f"collectives/workers~{self.workers}/nodes~{self.nodes}"


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Supervisor: start this module under torchrun with the same arguments."""
    from trainscale import launch

    env = launch.detect()
    if env.mode == "slurm" and args.nodes > 1 and not env.port:
        import dataclasses

        env = dataclasses.replace(env, port=launch.free_port())
    sweep = Sweep(args.study, args.workers, args.nodes)
    threads = str(args.threads)
    prefix = ["env", *(f"{k}={threads}" for k in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"))]
    cmd = [*prefix, *launch.torchrun(sweep, env, ["-m", "trainscale.collectives", *argv])]
    print("trainscale.collectives: launching:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, timeout=args.timeout_minutes * 60).returncode


def worker(args: argparse.Namespace) -> None:
    """One rank: time all_reduce at every size; rank 0 writes the JSON."""
    import torch
    import torch.distributed as dist

    from trainscale import metrics
    from trainscale.runners.common import detect_rank

    rk = detect_rank()
    torch.set_num_threads(args.threads)
    cuda = args.backend == "nccl"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("backend nccl needs GPUs; this node has none (use gloo)")
    device = torch.device(f"cuda:{rk.local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend=args.backend, device_id=device if cuda else None)

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
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync()
            times.append(time.perf_counter() - t0)
        slowest = torch.tensor(times[args.warmup :], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the collective ends with its last rank
        rows.append(summarise(size, slowest.tolist(), rk.world_size))
        if rk.is_main:
            r = rows[-1]
            print(
                f"{size:>12} B  p50 {r['p50_seconds'] * 1e6:10.1f} us  "
                f"busbw {r['busbw_bytes_per_second'] / 1e9:8.3f} GB/s",
                flush=True,
            )
    hosts: list = [None] * rk.world_size
    dist.all_gather_object(hosts, metrics.hostname())
    if rk.is_main:
        record = {
            "schema": SCHEMA_ID,
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
            "device": {
                "kind": device.type,
                "name": torch.cuda.get_device_name(device) if cuda else metrics.cpu_name(),
            },
            "env": {
                "hostnames": sorted(set(hosts)),
                "torch": torch.__version__,
                "utc": metrics.utc_now(),
            },
            "sizes": rows,
        }
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, out)
        print(f"trainscale.collectives: wrote {out}", flush=True)
    from trainscale.runners.pytorch import leave

    leave()  # without the gloo teardown that can deadlock at exit


def read(path: str | Path) -> dict:
    """One benchmark file; a clear error for anything that is not one."""
    rec = json.loads(Path(path).read_text())
    if rec.get("schema") != SCHEMA_ID or not rec.get("sizes"):
        raise ValueError(f"{path}: not a {SCHEMA_ID} file with timings")
    return rec


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainscale.collectives", description=__doc__)
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--workers", type=int, required=True, help="ranks per node")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--model", action="append", default=[], help="model:dataset (repeatable)")
    p.add_argument(
        "--max-bytes", type=int, default=0, help="largest size, if below the models' gradient"
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--study", default="study", help="for the rendezvous id")
    p.add_argument("--timeout-minutes", type=float, default=10.0)
    p.add_argument("--out", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if not args.model and not args.max_bytes:
        parser().error("give --model model:dataset (one or more) or --max-bytes")
    if "RANK" in os.environ:  # started by torchrun
        worker(args)
        return 0
    return run(args, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Predicted against measured peak memory per rank, for every cell one GPU can run.

Each cell is one run of a small study: bf16 autocast, AdamW, one rank, 2 epochs of `--steps`
steps (GPT-2 at seq_len 1024 and batch 16 on synthetic tokens; ResNet-50 at batch 256 on
synthetic ImageNet). Every cell is first predicted for CUDA as the planner predicts it
(trainscale.plan.preflight.memory.predict: one child traces every cell's step with fake
tensors through the runner's own wrapping), then trained through `python -m trainscale.launch`
as the train rule starts it (trainscale.gpu.paths.train). Printed per cell:

- allocated: the prediction's `total_bytes` against the record's `memory.peak_device_bytes`
  (torch.cuda.max_memory_allocated over training), and measured ÷ predicted − 1;
- reserved: the prediction's `reserved_bytes` (tensors' peak, the CUDA runtime and NCCL: what
  the planner holds against the device's memory) against `memory.peak_reserved_bytes` (the
  caching allocator's reserved peak) and `peak_nvml_process_bytes` (NVML's figure for the
  process: the allocator's blocks, the CUDA context and libraries);
- tokens (or images) per second and `flops.mfu`, for the strategies side by side.

The bars of issue 45: gpt2-124m under torch within 5 %, gpt2-774m under torch-fsdp within 10 %
(allocated). Cells are run one after another, never beside each other; the DeepSpeed cells
come last (their first run JIT-builds DeepSpeed's fused Adam; an offload cell's CPU Adam is
built first, as the `deepspeed_cpu_adam` rule builds it). `--env NAME=VALUE` sets a variable
for every run (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, say). Results also go to
OUT/gpu-memory.json.

    python3 benchmarks/gpu_memory.py [--cells torch,torch-fsdp,...] [--steps 10]
        [--out results/gpu-memory] [--env NAME=VALUE ...] [--predict-only]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from trainscale.gpu import paths as gpu_paths  # noqa: E402
from trainscale.plan import matrix  # noqa: E402
from trainscale.plan.preflight import memory  # noqa: E402

GPT = {"model": "gpt2-124m", "dataset": "synthetic-tokens", "seq_len": 1024, "batch_size": 16}
#: name -> the matrix values of the cell (one rank, bf16: set for all below)
CELLS: dict[str, dict] = {
    "torch": {"strategy": "torch", **GPT},
    "torch-ddp": {"strategy": "torch-ddp", **GPT},
    "torch-fsdp": {"strategy": "torch-fsdp", **GPT},
    "lightning-ddp": {"strategy": "lightning-ddp", **GPT},
    "torch-ckpt-full": {"strategy": "torch", **GPT, "activation_checkpointing": "full"},
    "torch-ckpt-selective": {"strategy": "torch", **GPT, "activation_checkpointing": "selective"},
    "torch-fsdp-774m": {"strategy": "torch-fsdp", **GPT, "model": "gpt2-774m"},
    "torch-resnet50": {
        "strategy": "torch",
        "model": "resnet50",
        "dataset": "synthetic-imagenet",
        "batch_size": 256,
        "scale": 4,
    },  # fmt: skip
    "deepspeed-zero1": {"strategy": "deepspeed-zero1", **GPT},
    "deepspeed-zero2": {"strategy": "deepspeed-zero2", **GPT},
    "deepspeed-zero3": {"strategy": "deepspeed-zero3", **GPT},
    "deepspeed-zero2-offload": {"strategy": "deepspeed-zero2", **GPT, "offload": "optimizer"},
    "deepspeed-zero3-offload": {"strategy": "deepspeed-zero3", **GPT, "offload": "params"},
    "torch-fsdp-offload": {"strategy": "torch-fsdp", **GPT, "offload": "params"},
}
GIB = 2**30


def study_keys(steps: int) -> dict:
    return {
        "study": "gpu-memory", "epochs": 2, "steps_per_epoch": steps, "eval_tokens": 16384,
        "timeout_minutes": 5, "optimizer": {"name": "adamw", "lr": 1e-4},
        "collectives": {"enabled": False},
    }  # fmt: skip


def cell_values(name: str) -> dict:
    return {"workers": 1, "precision": "bf16", **CELLS[name]}


def predicted(names: list[str], keys: dict) -> dict[str, dict]:
    """{cell: the pre-flight's answer for CUDA}, every cell traced by one child."""
    specs = {}
    for name in names:
        runs, dropped = matrix.build_runs(gpu_paths.study(keys, **cell_values(name)), "cuda")
        assert len(runs) == 1, (name, [d.reason for d in dropped])
        specs[name] = runs[0]
    t0 = time.perf_counter()
    answers = memory.predict(list(specs.values()), "cuda")
    print(f"predicted {len(specs)} cells for cuda in {time.perf_counter() - t0:.0f} s", flush=True)
    return {name: answers[spec.path] for name, spec in specs.items()}


def gib(n: float | None) -> str:
    return f"{n / GIB:7.2f}" if n else "      –"


def error(measured: float | None, predicted: float | None) -> str:
    return f"{measured / predicted - 1:+7.1%}" if measured and predicted else "      –"


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:200] if lines else ""


def build_cpu_adam(env: dict[str, str]) -> None:
    """DeepSpeed's CPU Adam built as the `deepspeed_cpu_adam` rule builds it, so the offload
    cells load that build (their logs then show whether a run compiled anything): into
    $PWD/.cache/torch_extensions, where the launcher points every DeepSpeed run."""
    build = ["trainscale.runners.torch.deepspeed_zero", "--build-ops", "cpu-adam"]
    cmd = [sys.executable, "-m", *build]
    where = {"TORCH_EXTENSIONS_DIR": str(Path.cwd() / ".cache" / "torch_extensions")}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=gpu_paths.child_env(**{**env, **where}), capture_output=True,
                       text=True)  # fmt: skip
    print(f"CPU Adam build: exit {p.returncode} in {time.perf_counter() - t0:.0f} s: "
          f"{last_line(p.stdout + p.stderr)}", flush=True)  # fmt: skip


def measure(name: str, keys: dict, answer: dict, out: Path, env: dict[str, str]) -> dict:
    ctx = gpu_paths.Context(out=out, timeout_minutes=keys["timeout_minutes"])
    t0 = time.perf_counter()
    try:
        rec = gpu_paths.train(ctx, name, env, keys=keys, **cell_values(name)).record
    except gpu_paths.CheckFailed as e:
        rec = {"status": "no record", "error": str(e)}
    mem = rec.get("memory") or {}
    row = {
        "cell": name, "status": rec.get("status"), "error": (rec.get("error") or "")[-600:],
        "predicted_bytes": answer.get("total_bytes"),
        "predicted_reserved_bytes": answer.get("reserved_bytes"),
        "predicted_error": answer.get("error"), "method": answer.get("method"),
        "peak_device_bytes": mem.get("peak_device_bytes"),
        "peak_reserved_bytes": mem.get("peak_reserved_bytes"),
        "peak_nvml_process_bytes": mem.get("peak_nvml_process_bytes"),
        "throughput": rec.get("throughput"), "tokens_per_second": rec.get("tokens_per_second"),
        "mfu": (rec.get("flops") or {}).get("mfu"), "wall_seconds": time.perf_counter() - t0,
    }  # fmt: skip
    print(
        f"{name:<22}{row['status'] or '-':<10}{gib(row['predicted_bytes'])}"
        f"{gib(row['peak_device_bytes'])} {error(row['peak_device_bytes'], row['predicted_bytes'])}"
        f"{gib(row['predicted_reserved_bytes'])}{gib(row['peak_reserved_bytes'])}"
        f"{gib(row['peak_nvml_process_bytes'])} "
        f"{error(row['peak_reserved_bytes'], row['predicted_reserved_bytes'])}"
        f"{row['throughput'] or 0:11.0f} {row['mfu'] or 0:6.3f} {row['wall_seconds']:5.0f} s"
        + ("" if row["status"] == "ok" else f"  ({last_line(row['error'])!r})"),
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description="Predicted against measured peak memory per rank")
    p.add_argument("--cells", default=",".join(CELLS), help="comma-separated: " + ", ".join(CELLS))
    p.add_argument("--steps", type=int, default=10, help="steps an epoch (2 epochs)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-memory")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable every run gets (repeatable)")  # fmt: skip
    p.add_argument("--predict-only", action="store_true")
    a = p.parse_args()
    env = dict(kv.split("=", 1) for kv in a.env)
    names = [c for c in a.cells.split(",") if c]
    if unknown := set(names) - set(CELLS):
        p.error(f"--cells: unknown {sorted(unknown)}; known: {', '.join(CELLS)}")
    keys = study_keys(a.steps)
    answers = predicted(names, keys)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.predict_only:
        for name, ans in answers.items():
            print(f"{name:<22}{gib(ans.get('total_bytes'))} allocated, "
                  f"{gib(ans.get('reserved_bytes'))} reserved ({ans.get('method')})")  # fmt: skip
        return
    print(f"{'cell':<22}{'status':<10}{'pred':>7}{'meas':>7} {'err':>7}{'pred r':>7}"
          f"{'res':>7}{'nvml':>7} {'err r':>7}{'samples/s':>11} {'MFU':>6} wall")  # fmt: skip
    if any(CELLS[n].get("offload") == "optimizer" for n in names):
        build_cpu_adam(env)
    rows = [measure(name, keys, answers[name], a.out, env) for name in names]
    (a.out / "gpu-memory.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

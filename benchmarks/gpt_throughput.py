"""Does the `torch` strategy train a GPT as fast as a bare loop of the same model?

Each round runs both sides on one process, alternating which goes first (A/B, then B/A):

- runner: trainscale's `torch` strategy through the real launcher (trainscale.launch.supervise:
  the env prefix, the loop, the metrics record), `--steps` steps an epoch, epoch 1 warm-up and
  epochs 2.. timed; its tokens/s is the record's `tokens_per_second`.
- bare: benchmarks/minimal_gpt.py, nanoGPT's loop reduced to a step (the same model, ids,
  AdamW, precision), `--steps` warm-up steps then `--steps × (epochs − 1)` timed ones.

It prints each side's tokens/s min/median/max over the rounds with its spread (max/min; under
1.05 for a 2% effect to be seen), the ratio runner / bare (min/median/max; the bar is a median
≥ 0.98) and both MFUs: the runner's `flops.mfu`, and the bare loop's from the same counted
FLOPs per token and the same peak (the record's `flops.peak_per_second` and source). Both
sides step the optimizer as `--fused` says (config optimizer.fused: auto, true, false) and time
steps alike (CUDA events on a GPU); the step-time spread (p95 / p50 of the timed steps, the
median over rounds) is printed per side. The load average is printed with every line: a busy
machine shows as spread.

    .venv/bin/python benchmarks/gpt_throughput.py [--model gpt-micro] [--seq-len 256]
        [--batch 8] [--precision fp32] [--threads 2] [--steps 8] [--epochs 3] [--rounds 5]
        [--dataset shakespeare] [--compile] [--fused auto|true|false]
    .venv/bin/python benchmarks/gpt_throughput.py --model hf:tiny-llama   # a Hugging Face config:
        # trainscale's `torch` runner against a bare loop of the same transformers model
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT / "workflow"), os.environ.get("PYTHONPATH")])
)

from harness_overhead import in_order, runner_record, spread  # noqa: E402

from trainscale.launch.supervise import worker_env  # noqa: E402
from trainscale.plan.check import load_config  # noqa: E402
from trainscale.plan.matrix import RunSpec, build_runs  # noqa: E402


def spec(a: argparse.Namespace) -> RunSpec:
    if a.model.startswith("hf:"):
        return hf_spec(a)
    return RunSpec(
        study="bench", strategy="torch", model=a.model, dataset=a.dataset, scale=1,
        batch_size=a.batch, batch_mode="global", workers=1, nodes=1, precision=a.precision,
        repeat=0, seed=0, epochs=a.epochs, optimizer="adamw", lr=1e-3, base_lr=1e-3,
        lr_scaling="none", betas=(0.9, 0.999), eps=1e-7, weight_decay=0.0, momentum=0.0,
        global_batch_size=a.batch, per_worker_batch_size=a.batch, world_size=1,
        threads_per_worker=a.threads, timeout_minutes=60, target_accuracy=None,
        data_dir="data", steps_per_epoch=a.steps, seq_len=a.seq_len, compile=a.compile,
        fused=FUSED[a.fused], accelerator=ACCELERATOR,
    )  # fmt: skip


def hf_spec(a: argparse.Namespace) -> RunSpec:
    """The `torch` run of an `hf:` model as the planner makes it (its own-model entry and
    pre-flight), at the benchmark's sizes."""
    study = {"study": "bench", "epochs": a.epochs, "steps_per_epoch": a.steps,
             "optimizer": {"name": "adamw", "lr": 1e-3, "eps": 1e-7, "weight_decay": 0.0},
             "matrix": {"strategy": ["torch"], "model": [a.model], "dataset": [a.dataset],
                        "seq_len": [a.seq_len], "batch_size": [a.batch],
                        "precision": [a.precision]}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(study))
        config, problems = load_config(path)
    assert not problems, problems
    runs, _ = build_runs(config)  # the overlay keeps config.yaml's other axes: one process
    run = next(r for r in runs if r.world_size == 1 and r.repeat == 0)
    return dataclasses.replace(
        run,
        threads_per_worker=a.threads,
        compile=a.compile,
        fused=FUSED[a.fused],
        accelerator=ACCELERATOR,
    )


#: both sides train on the GPU where there is one (minimal_gpt.py picks its device so)
ACCELERATOR = "cuda" if torch.cuda.is_available() else "cpu"
#: --fused as config optimizer.fused has it
FUSED = {"auto": "auto", "true": True, "false": False}


def bare(s: RunSpec, a: argparse.Namespace) -> dict:
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "minimal_gpt.py"), f"--model={s.model}",
        f"--dataset={s.dataset}", f"--seq-len={s.seq_len}", f"--batch={s.batch_size}",
        f"--warmup={a.steps}", f"--steps={a.steps * (a.epochs - 1)}",
        f"--precision={s.precision}", *(["--compile"] if a.compile else []),
        f"--fused={a.fused}",
        *([f"--hf-config={s.own_model.builder_kwargs['config']}"] if s.own_model else []),
    ]  # fmt: skip
    env = {**os.environ, **worker_env(s)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def trio(xs: list[float]) -> str:
    return f"{min(xs):>10.0f} {statistics.median(xs):>10.0f} {max(xs):>10.0f}"


def main() -> None:
    p = argparse.ArgumentParser(
        description=(
            "Does the `torch` strategy train a GPT as fast as a bare loop of the same model?"
        )
    )
    p.add_argument("--model", default="gpt-micro")
    p.add_argument("--dataset", default="shakespeare", choices=("shakespeare", "synthetic-tokens"))
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--threads", type=int, default=2, help="CPU threads of the one process")
    p.add_argument("--steps", type=int, default=8, help="steps an epoch (bare: warm-up steps)")
    p.add_argument("--epochs", type=int, default=3, help="epoch 1 is warm-up, the rest timed")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile on both sides")
    p.add_argument("--fused", default="auto", choices=tuple(FUSED), help="optimizer.fused")
    a = p.parse_args()
    s = spec(a)
    print(
        f"{s.model}, {s.dataset}, seq_len {s.seq_len}, batch {s.batch_size}, {s.precision}, "
        f"{a.threads} threads, {a.steps} steps × {a.epochs} epochs, compile {a.compile}, "
        f"fused {a.fused}; "
        f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    runner_x, bare_x, ratios, mfu_r, mfu_b = [], [], [], [], []
    steps_r, steps_b, how = [], [], set()
    peak = None
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            rec, b = in_order(i, lambda: runner_record(s, Path(tmp)), lambda: bare(s, a))
            x_r, flops, x_b = rec["tokens_per_second"], rec["flops"], b["tokens_per_second"]
            timed = rec["epochs"][1:]
            steps_r.append(statistics.median(e["step_seconds_p95"] / e["step_seconds_p50"]
                                             for e in timed))  # fmt: skip
            steps_b.append(b["step_seconds_p95"] / b["step_seconds_p50"])
            how |= {f"runner {rec['optimizer']['implementation']}", f"bare {b['optimizer']}"}
            per_token = flops["per_sample"] / s.seq_len
            peak = (flops["peak_per_second"], flops["peak_source"], flops["peak_device"])
            runner_x.append(x_r)
            bare_x.append(x_b)
            ratios.append(x_r / x_b)
            mfu_r.append(flops["mfu"])
            mfu_b.append(per_token * x_b / flops["peak_per_second"])
            first = "runner" if i % 2 == 0 else "bare"
            print(
                f"round {i + 1}: runner {x_r:.0f} tokens/s, bare {x_b:.0f} tokens/s, ratio "
                f"{x_r / x_b:.3f} ({first} first; load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print(f"\n{'side':<8}{'min':>10} {'median':>10} {'max':>10} {'spread':>8} {'MFU med':>9} "
          f"{'step p95/p50':>13}")  # fmt: skip
    sides = (("runner", runner_x, mfu_r, steps_r), ("bare", bare_x, mfu_b, steps_b))
    for name, xs, mfu, st in sides:
        print(f"{name:<8}{trio(xs)} {spread(xs):>8.3f} {statistics.median(mfu):>9.4f} "
              f"{statistics.median(st):>13.3f}")  # fmt: skip
    print(f"optimizer: {', '.join(sorted(how))}")
    med = statistics.median(ratios)
    verdict = "meets" if med >= 0.98 else "below"
    print(
        f"ratio runner/bare: min {min(ratios):.3f}, median {med:.3f}, max {max(ratios):.3f} "
        f"({verdict} the 0.98 bar)"
    )
    print(f"peak {peak[0] / 1e9:.1f} GFLOP/s ({peak[1]}, {peak[2]}); MFU = counted FLOPs/token × "
          "tokens/s ÷ peak")  # fmt: skip
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

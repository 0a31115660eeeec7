"""What does activation checkpointing cost in speed, and what does it save in activations?

gpt-micro (or `--model`) under the `torch` strategy on CPU, through the real launcher
(trainscale.launch.supervise), with `activation_checkpointing` none, full and selective. Each
round runs the three in a rotated order (none/full/selective, then full/selective/none, ...),
so an order effect (a warm cache, a burst of load) falls on every mode alike. For each mode it
prints:

- tokens/s (the record's `tokens_per_second`, steady epochs 2..E): min/median/max over the
  rounds, and the median ratio to `none`;
- the activation bytes of one step, traced as the memory pre-flight traces it
  (trainscale.runners.torch.memory.trace: the checkpointed model under PyTorch's MemTracker;
  a prediction, deterministic, traced once), and its ratio to `none`;
- the record's `flops.mfu` and `flops.hfu` (model and hardware FLOPs utilisation).

The anchors' expectation: `full` about 20-35% slower than `none` with far smaller
activations, `selective` in between. The load average is printed with every round.

    .venv/bin/python benchmarks/checkpointing_cost.py [--model gpt-micro] [--seq-len 256]
        [--batch 8] [--threads 2] [--steps 6] [--epochs 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT / "workflow"), os.environ.get("PYTHONPATH")])
)

from harness_overhead import runner_record  # noqa: E402

from trainscale.plan.matrix import RunSpec  # noqa: E402
from trainscale.runners.torch.memory import trace as memory_trace  # noqa: E402

MODES = ("none", "full", "selective")


def spec(a: argparse.Namespace, mode: str) -> RunSpec:
    return RunSpec(
        study="bench", strategy="torch", model=a.model, dataset="shakespeare", scale=1,
        batch_size=a.batch, batch_mode="global", workers=1, nodes=1, precision="fp32",
        repeat=0, seed=0, epochs=a.epochs, optimizer="adamw", lr=1e-3, base_lr=1e-3,
        lr_scaling="none", betas=(0.9, 0.999), eps=1e-7, weight_decay=0.0, momentum=0.0,
        global_batch_size=a.batch, per_worker_batch_size=a.batch, world_size=1,
        threads_per_worker=a.threads, timeout_minutes=60, target_accuracy=None,
        data_dir="data", steps_per_epoch=a.steps, seq_len=a.seq_len,
        activation_checkpointing=mode,
    )  # fmt: skip


def activations(s: RunSpec) -> int:
    """One step's activation bytes as the memory pre-flight traces them (on fake tensors)."""
    return memory_trace.predict(s, "cpu")["parts"]["activations"]


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(
        description=(
            "What does activation checkpointing cost in speed, "
            "and what does it save in activations?"
        )
    )
    p.add_argument("--model", default="gpt-micro")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="steps an epoch")
    p.add_argument("--epochs", type=int, default=3, help="epoch 1 is warm-up, the rest steady")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    print(f"{a.model}, seq_len {a.seq_len}, batch {a.batch}, {a.threads} threads, torch on CPU")
    act = {m: activations(spec(a, m)) for m in MODES}
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    fus: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            order = MODES[i % 3 :] + MODES[: i % 3]
            for m in order:
                rec = runner_record(dataclasses.replace(spec(a, m), repeat=i), Path(tmp))
                rates[m].append(rec["tokens_per_second"])
                fus[m] = (rec["flops"]["mfu"], rec["flops"]["hfu"])
            got = ", ".join(f"{m} {rates[m][-1]:,.0f}" for m in MODES)
            print(f"round {i + 1} ({'/'.join(order)}): tokens/s {got}  [{load()}]")
    base = statistics.median(rates["none"])
    print(f"\n{'mode':<10} {'tokens/s min/median/max':>30} {'÷ none':>7} "
          f"{'activations':>12} {'÷ none':>7} {'MFU':>6} {'HFU':>6}")  # fmt: skip
    for m in MODES:
        xs = rates[m]
        mid = statistics.median(xs)
        line = f"{min(xs):,.0f} / {mid:,.0f} / {max(xs):,.0f}"
        mfu, hfu = fus[m]
        print(f"{m:<10} {line:>30} {mid / base:>7.3f} {act[m] / 2**20:>9.1f} MiB "
              f"{act[m] / act['none']:>7.3f} {mfu:>6.1%} {hfu:>6.1%}")  # fmt: skip
    print(f"[{load()}]")


if __name__ == "__main__":
    main()

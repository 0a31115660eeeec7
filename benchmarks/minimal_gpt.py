"""A bare GPT training loop, nanoGPT's train.py reduced to what a step costs: the yardstick for
the `torch` strategy on a GPT (benchmarks/gpt_throughput.py).

One process: the same model (trainscale.models.gpt, or with `--hf-config` the transformers
model `AutoModelForCausalLM.from_config` builds, called as transformers' own loops call it),
windows of the same ids (the shipped
byte corpus, or synthetic-tokens' seeded random ids) drawn at random, next-token
cross-entropy, AdamW (fused, foreach or a loop over the tensors as `--fused` says, by the
runner's own rule: trainscale.runners.torch.torch_parts.optimizer_implementation), fp32 (or
bf16 autocast), on the GPU when there is one. `--warmup` steps, then `--steps` timed ones, each
step timed as the runner times it (CUDA events on a GPU: no wait per step). Prints one JSON line:
{"tokens_per_second": ..., "seconds": ..., "steps": ..., "step_seconds_p50": ...,
"step_seconds_p95": ..., "optimizer": ...}.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from trainscale.data import catalogue, tokens
from trainscale.models import gpt
from trainscale.runners.torch.step_timer import StepTimer
from trainscale.runners.torch.torch_parts import optimizer_implementation

p = argparse.ArgumentParser()
p.add_argument("--model", default="gpt-micro")
p.add_argument("--dataset", choices=("shakespeare", "synthetic-tokens"), default="shakespeare")
p.add_argument("--seq-len", type=int, default=256)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--warmup", type=int, default=8)
p.add_argument("--steps", type=int, default=16)
p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
p.add_argument("--compile", action="store_true")
p.add_argument("--hf-config", help="a config.json: train transformers' model of it instead")
p.add_argument("--fused", choices=("auto", "true", "false"), default="auto")
a = p.parse_args()

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
info = catalogue.info(a.dataset)
train = tokens.split_ids(a.dataset, None, "train", 0, info.train_samples, info.num_classes)
data = torch.from_numpy(train.astype(np.int64))
torch.manual_seed(0)
if a.hf_config:
    from transformers import AutoModelForCausalLM

    from trainscale.models.hf import load_config

    hf = AutoModelForCausalLM.from_config(load_config(a.hf_config), attn_implementation="sdpa")
    model = hf.to(device)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(input_ids=x, use_cache=False).logits
else:
    model = forward = gpt.build(a.model, a.seq_len, info.num_classes).to(device)
step_model = torch.compile(forward) if a.compile else forward
fused = {"true": True, "false": False}.get(a.fused, "auto")
how = optimizer_implementation(argparse.Namespace(fused=fused, optimizer="adamw"), device.type)
kw = {"fused": True} if how == "fused" else {"foreach": how == "foreach"}
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-7, **kw)
dtype = torch.bfloat16 if a.precision == "bf16" else None


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - a.seq_len - 1, (a.batch,))
    x = torch.stack([data[i : i + a.seq_len] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + a.seq_len] for i in ix])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def step() -> None:
    x, y = batch()
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        logits = step_model(x)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


for _ in range(a.warmup):
    step()
sync()
timer = StepTimer(device)
t0 = time.perf_counter()
for _ in range(a.steps):
    timer.step_starts()
    step()
    timer.step_ends()
sync()
seconds = time.perf_counter() - t0
rate = a.steps * a.batch * a.seq_len / seconds
p50, p95 = np.percentile(timer.seconds(), [50, 95])
print(
    json.dumps(
        {
            "tokens_per_second": rate,
            "seconds": seconds,
            "steps": a.steps,
            "step_seconds_p50": p50,
            "step_seconds_p95": p95,
            "optimizer": how,
        }
    )
)

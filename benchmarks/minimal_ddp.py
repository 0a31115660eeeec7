"""A minimal hand-written DDP loop (the PyTorch DDP tutorial's), the yardstick for the runner.

Launched by benchmarks/harness_overhead.py with torchrun; prints one JSON line on rank 0:
{"throughput": steady samples/s over all ranks}. Same data arrays, same model, same
optimizer and batch as the runner, and nothing else.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from trainscale import data
from trainscale.models import torch_models as models

p = argparse.ArgumentParser()
p.add_argument("--model", default="seed-small")
p.add_argument("--dataset", default="digits")
p.add_argument("--scale", type=int, default=8)
p.add_argument("--batch", type=int, default=128, help="global batch")
p.add_argument("--epochs", type=int, default=4)
a = p.parse_args()

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
arr = data.load(a.dataset, "data", seed=0)
mean = torch.tensor(arr.mean).view(1, -1, 1, 1)
std = torch.tensor(arr.std).view(1, -1, 1, 1)
x = ((torch.from_numpy(arr.train_x).float() / arr.x_max) - mean) / std
y = torch.from_numpy(arr.train_y)
torch.manual_seed(0)
model = DDP(models.build(a.model, arr.info.shape, arr.info.num_classes))
opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-7)
n, b = len(y) * a.scale, a.batch // world
steps = n // world // b
seconds = samples = 0.0
for epoch in range(a.epochs):
    g = torch.Generator().manual_seed(epoch)
    shard = torch.randperm(n, generator=g)[rank::world] % len(y)
    dist.barrier()
    t0 = time.perf_counter()
    for s in range(steps):
        idx = shard[s * b : (s + 1) * b]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.barrier()
    if epoch > 0:  # epoch 1 is warm-up, as in the runner's steady throughput
        seconds += time.perf_counter() - t0
        samples += steps * b * world
if rank == 0:
    print(json.dumps({"throughput": samples / seconds}), flush=True)
dist.destroy_process_group()

"""A minimal hand-written Horovod loop (Horovod's PyTorch example), the yardstick for the runner.

Launched by benchmarks/harness_overhead.py with horovodrun (gloo); prints one JSON line on
rank 0: {"throughput": steady samples/s over all ranks}. Same data arrays, same model, same
optimizer and batch as the runner, and nothing else.
"""

import argparse
import json
import os
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from trainscale import data
from trainscale.models import torch_models as models

p = argparse.ArgumentParser()
p.add_argument("--model", default="seed-small")
p.add_argument("--dataset", default="digits")
p.add_argument("--scale", type=int, default=8)
p.add_argument("--batch", type=int, default=128, help="global batch")
p.add_argument("--epochs", type=int, default=4)
a = p.parse_args()

hvd.init()
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
rank, world = hvd.rank(), hvd.size()
arr = data.load(a.dataset, "data", seed=0)
mean = torch.tensor(arr.mean).view(1, -1, 1, 1)
std = torch.tensor(arr.std).view(1, -1, 1, 1)
x = ((torch.from_numpy(arr.train_x).float() / arr.x_max) - mean) / std
y = torch.from_numpy(arr.train_y)
torch.manual_seed(0)
model = models.build(a.model, arr.info.shape, arr.info.num_classes)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-7)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
n, b = len(y) * a.scale, a.batch // world
steps = n // world // b
seconds = samples = 0.0
for epoch in range(a.epochs):
    g = torch.Generator().manual_seed(epoch)
    shard = torch.randperm(n, generator=g)[rank::world] % len(y)
    hvd.barrier()
    t0 = time.perf_counter()
    for s in range(steps):
        idx = shard[s * b : (s + 1) * b]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    hvd.barrier()
    if epoch > 0:  # epoch 1 is warm-up, as in the runner's steady throughput
        seconds += time.perf_counter() - t0
        samples += steps * b * world
if rank == 0:
    print(json.dumps({"throughput": samples / seconds}), flush=True)

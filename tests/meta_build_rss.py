"""Run by torchrun (tests/test_meta_init.py): one rank of torch-fsdp builds `--spec`'s model as
the runner does (PyTorch loop: on the meta device, sharded, then its share materialised and
initialised), and writes its peak host RSS (the kernel's VmHWM) after the build as JSON."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainscale.models import torch_models as models
from trainscale.plan.runspec import RunSpec
from trainscale.runners.torch.pytorch import materialise, shard


def vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


spec = RunSpec.from_dict(json.loads(sys.argv[1]))
dist.init_process_group("gloo")
torch.set_num_threads(1)
before = vm_hwm_bytes()
vocab = int(sys.argv[3])
net = models.build(spec.model, (spec.seq_len,), vocab, spec.own_model, seed=spec.seed, meta=True)
shard(net, None, False, spec.own_model)
materialise(net, torch.device("cpu"), spec)
held = sum(p.to_local().numel() * p.element_size() for p in net.parameters())
out = {
    "rank": dist.get_rank(),
    "before": before,
    "peak": vm_hwm_bytes(),
    "held": held,
    "params": models.param_count(net),
}
Path(sys.argv[2]).with_suffix(f".{dist.get_rank()}.json").write_text(json.dumps(out))
dist.destroy_process_group()

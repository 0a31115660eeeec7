"""Helpers shared by test modules (tests/STYLE: here, not imported from conftest)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def allocator_peak(trace: Path) -> int:
    """The CPU allocator's peak bytes in a torch.profiler chrome trace recorded with
    `profile_memory=True`: the largest "Total Allocated" of its memory events (the allocator's
    own count of what it holds, independent of the memory trackers)."""
    events = json.loads(trace.read_text())["traceEvents"]
    return max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")


def tensor_parallel_steps(rank: int, spec_json: str, port: int, out: str, steps: int = 2) -> None:
    """One rank of a real torch-tp run over gloo (spawned: torch.multiprocessing): the model
    built, split and initialised as the runner builds it, `steps` optimizer steps in the
    loop's order (Plugin.step: torch_parts.loss_of on the logits split by vocabulary), under
    the profiler's memory events; the allocator's peak written to `out`/peak-RANK.txt."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile

    from trainscale.models import torch_models as models
    from trainscale.plan.runspec import RunSpec
    from trainscale.runners.torch import tp_plans
    from trainscale.runners.torch.memory.steps import meta_model
    from trainscale.runners.torch.pytorch import materialise
    from trainscale.runners.torch.torch_parts import loss_of, make_optimizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    spec = RunSpec.from_json(spec_json)
    cpu = torch.device("cpu")
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    trace = Path(out) / f"trace-{rank}.json"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        net = meta_model(spec)
        tp_plans.parallelize(net, mesh["tp"], models.blocks(net, spec.own_model),
                             spec.own_model, sequence_parallel=True)  # fmt: skip
        materialise(net, cpu, spec)
        opt = make_optimizer(spec, net.parameters())
        ids = torch.randint(0, 256, (spec.per_worker_batch_size, spec.seq_len + 1))
        x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss_of(net(x).float(), y).backward()
            opt.step()
    prof.export_chrome_trace(str(trace))
    (Path(out) / f"peak-{rank}.txt").write_text(str(allocator_peak(trace)))
    dist.destroy_process_group()


def report_of_runs(results: Path, out: Path) -> str:
    """The HTML report of the runs under `results`/runs, written to `out` by the report_html
    rule's own function, without figures: for a study whose tests read one fact of its report,
    so that it stops at runs.csv (the rules that draw the figures and embed them, up to
    report.html, run in conftest.torch_study, checked by tests/test_workflow.py)."""
    from trainscale.analysis import aggregate
    from trainscale.analysis.study import Study
    from trainscale.report import html as report

    study = Study.build(aggregate.find_metrics(results / "runs"), name=results.name)
    return report.write_html(study, out, None).read_text()

"""The GPU paths `make gpu-check` runs (`trainscale.gpu.check` is its command line and verdicts).

Each path is a small run (digits, seed-small, 2 epochs) built by `trainscale.plan.matrix.build_runs`
from a study config, as the workflow builds its runs, and started by `trainscale.launch` (the
supervisor the `train` rule calls), or the all-reduce benchmark `trainscale.runners.collectives`.
Then its metrics are judged by `gpu_run_problems`: status ok on a CUDA device, throughput and epoch
timings consistent, NVML utilisation and energy present, peak device memory at least the model's
weights. A check returns None when its path works, else the reason, or raises `CheckFailed`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.measure import metrics
from trainscale.plan import catalog, matrix
from trainscale.plan.runspec import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # workflow/: where `trainscale` lives

#: The study every path's run comes from; each path overrides matrix keys.
BASE_STUDY = {
    "study": "gpu-check",
    "epochs": 2,
    "accelerator": "cuda",
    "timeout_minutes": 10,
    "matrix": {
        "strategy": ["torch"],
        "model": ["seed-small"],
        "dataset": ["digits"],
        "batch_size": [64],
        "workers": [1],
        "precision": ["fp32"],
        "exclude": [],
    },
}


@dataclass
class Context:
    """Where a check writes, and what it may assume about the node."""

    out: Path
    python: str = sys.executable
    timeout_minutes: float = 10.0
    first_gpu: str = "0"  # CUDA_VISIBLE_DEVICES entry that pins a run to one GPU


@dataclass(frozen=True)
class Check:
    """One GPU path: `run` returns None when it works, else why not."""

    name: str
    what: str
    run: Callable[[Context], str | None]
    needs: tuple[str, ...] = ()  # modules that must be importable, else NOT INSTALLED
    probe: Callable[[Context], str | None] | None = None  # what is missing, or None


@dataclass
class Run:
    """One training run a check started: its record and its log."""

    record: dict
    log: str = ""
    spec: dict = field(default_factory=dict)


# --- running things -------------------------------------------------------------------------


def one_line(text: str, limit: int = 300) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def study(keys: dict | None = None, **matrix_values) -> dict:
    """BASE_STUDY with study-level `keys` set and matrix keys replaced, validated and filled
    in as the Snakefile does."""
    from snakemake.utils import validate

    cfg = copy.deepcopy(BASE_STUDY)
    cfg.update(keys or {})
    cfg["matrix"].update({k: [v] for k, v in matrix_values.items()})
    validate(cfg, str(matrix.CONFIG_SCHEMA))
    return cfg


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_DIR), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def train(
    ctx: Context,
    name: str,
    env: dict[str, str] | None = None,
    keys: dict | None = None,
    **values,
) -> Run:
    """One run through `python -m trainscale.launch`, as the `train` rule starts it, of the
    study `study(keys, **values)`; its log and metrics under ctx.out/name/."""
    runs, dropped = matrix.build_runs(study(keys, **values), "cuda")
    if len(runs) != 1:
        why = "; ".join(d.reason for d in dropped) or f"{len(runs)} runs"
        raise CheckFailed(f"the matrix gave no single run ({why})")
    spec = runs[0]
    where = ctx.out / name
    where.mkdir(parents=True, exist_ok=True)
    out = where / "metrics.json"
    out.unlink(missing_ok=True)
    cmd = [ctx.python, "-m", "trainscale.launch", "--spec", spec.to_json(), "--out", str(out)]
    p = subprocess.run(
        cmd,
        env=child_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=ctx.timeout_minutes * 60 + 120,
    )
    log = p.stdout + p.stderr
    (where / "run.log").write_text(log)
    if not out.exists():
        raise CheckFailed(f"no metrics written (launcher exit {p.returncode}): {log[-300:]}")
    return Run(metrics.read(out), log, spec.to_dict())


class CheckFailed(Exception):
    """A check's reason to fail, raised from deep inside it."""


def nvml_note(log: str) -> str:
    """The runner's own words on why NVML gave nothing, if it said."""
    said = [ln for ln in log.splitlines() if "no NVML readings" in ln or "NVML reads" in ln]
    return f" ({one_line(said[0], 160)})" if said else ""


def gpu_run_problems(run: Run, nvml: bool = True) -> str | None:
    """What is wrong with a run that should have trained on a GPU, or None."""
    r = run.record
    if r["status"] != "ok":
        return f"status {r['status']}: {one_line(r.get('error') or '')}"
    problems = []
    dev = r["device"]
    if dev["kind"] != "cuda":
        problems.append(f"device.kind {dev['kind']!r}, not 'cuda'")
    if not r["throughput"] or r["throughput"] <= 0:
        problems.append(f"throughput {r['throughput']}")
    for e in r["epochs"][1:]:
        # every step is synchronised: steps × median step time is about the epoch's time
        p50 = e.get("step_seconds_p50")
        if p50 is None or not 0.4 <= e["steps"] * p50 / e["seconds"] <= 2.5:
            problems.append(
                f"epoch {e['epoch']}: {e['steps']} steps × median {p50} s does not match its "
                f"{e['seconds']:.3g} s (unsynchronised timing?)"
            )
        if not math.isfinite(e["train_loss"] or math.nan):
            problems.append(f"epoch {e['epoch']}: train loss {e['train_loss']}")
    peak, params = r["memory"]["peak_device_bytes"], r["model"]["params"]
    weights = 4 * (params or 0) // max(1, r["spec"]["world_size"])  # fp32, sharded at most
    reserved = r["memory"].get("peak_reserved_bytes")
    if not peak:
        problems.append(f"peak_device_bytes missing ({peak})")
    elif peak < weights:
        problems.append(f"peak_device_bytes {peak} below the weights' {weights} B")
    elif torch_family(r["spec"]["strategy"]) and not (reserved and reserved >= peak):
        # the caching allocator's reserved peak, at least the allocated one: what memory.check's
        # prediction is measured against (lightning-ddp recorded none on an H200)
        problems.append(f"peak_reserved_bytes {reserved} missing or below the allocated {peak}")
    process = r["memory"].get("peak_nvml_process_bytes")
    if nvml and reserved and process and process < reserved:
        # NVML counts the allocator's blocks and the context: read below the reserved peak, it
        # was read after the blocks were freed (lightning-ddp's, after its teardown, on an H200)
        problems.append(f"peak_nvml_process_bytes {process} below the reserved peak {reserved}")
    if nvml and (dev["utilization_mean"] is None or dev["energy_joules"] is None):
        problems.append(
            f"NVML readings missing: utilization_mean {dev['utilization_mean']}, "
            f"energy_joules {dev['energy_joules']}{nvml_note(run.log)}"
        )
    return "; ".join(problems) or None


def torch_family(strategy: str) -> bool:
    return catalog.STRATEGIES[strategy].runtime == "torch"


def trains(name: str, env: Callable[[Context], dict] | None = None, **values) -> Callable:
    """A check that one run trains on the GPU and passes `gpu_run_problems`."""

    def run(ctx: Context) -> str | None:
        return gpu_run_problems(train(ctx, name, env(ctx) if env else None, **values))

    return run


def one_gpu(ctx: Context) -> dict[str, str]:
    """Pin every rank of a run to the same GPU."""
    return {"CUDA_VISIBLE_DEVICES": ctx.first_gpu}


def pipeline_two_stages(ctx: Context) -> str | None:
    """Two pipeline stages, each on a GPU of its own where the node has two; on a node of one
    GPU the runner must refuse the shared GPU with its reason (status failed, no hang)."""
    gpus = python_says(ctx, "import torch; print(torch.cuda.device_count())")
    if gpus.isdigit() and int(gpus) >= 2:
        return gpu_run_problems(
            train(ctx, "torch-pipeline-2-stages", strategy="torch-pipeline", workers=2)
        )
    run = train(
        ctx, "torch-pipeline-2-stages", one_gpu(ctx), strategy="torch-pipeline", workers=2
    ).record
    if run["status"] != "failed" or "a stage needs a GPU of its own" not in (run["error"] or ""):
        return (
            f"one GPU: expected the refusal of 2 stages on it, got status {run['status']!r}: "
            f"{one_line(run.get('error') or '')}"
        )
    return None


#: torch-tp at 2 ranks on gpt-nano (the matrix keys of tp_shared_gpu)
TP_TWO_RANKS = {"strategy": "torch-tp", "model": "gpt-nano", "dataset": "shakespeare",
                "seq_len": 64, "batch_size": 8, "workers": 2, "tp": 2}  # fmt: skip


def tp_kept_on_one_gpu() -> str | None:
    """Why the planner, told the node has 1 GPU, did not drop the 2-rank TP cell with its
    reason (None: it did). The cell is the matrix's only one, so its drop empties the matrix,
    which the planner refuses with every drop's reason."""
    try:
        _, dropped = matrix.build_runs(study(**TP_TWO_RANKS), "cuda", 1)
        reasons = [d.reason for d in dropped]
    except ConfigError as e:
        reasons = [str(e)]
    if not any("a rank needs one of its own" in r for r in reasons):
        return f"not dropped for 1 GPU: {reasons}"
    return None


def tp_shared_gpu(ctx: Context) -> str | None:
    """torch-tp with its 2 ranks on one GPU: the planner, told the node has 1 GPU, drops the
    cell with its reason; a run launched there anyway ends failed with the runner's reason,
    not with a signal (DTensor over gloo with CUDA tensors crashed in its all-gather)."""
    if why := tp_kept_on_one_gpu():
        return why
    run = train(ctx, "torch-tp-shared-gpu", one_gpu(ctx), **TP_TWO_RANKS).record
    if run["status"] != "failed" or "a rank needs one of its own" not in (run["error"] or ""):
        return (
            f"one GPU: expected the runner's refusal, got status {run['status']!r}: "
            f"{one_line(run.get('error') or '')}"
        )
    return None


def oom_then_ok(ctx: Context) -> str | None:
    """VGG19 at 224×224 with a batch no GPU holds (its first two conv layers' activations alone
    take 8192 × 2 × 64 × 224² × 4 B ≈ 210 GB): status oom with PyTorch's allocator message;
    then a normal run on the same GPU must be unaffected."""
    big = train(
        ctx,
        "cuda-oom",
        model="vgg19",
        dataset="synthetic-imagenet",
        scale=7,
        batch_size=8192,
    ).record
    if big["status"] != "oom":
        return f"status {big['status']!r}, expected 'oom': {one_line(big.get('error') or '')}"
    if "CUDA out of memory" not in (big["error"] or ""):
        return f"status oom without the allocator's message: {one_line(big['error'] or '')}"
    after = gpu_run_problems(train(ctx, "cuda-oom-next-run"))
    return after and f"the run after the OOM: {after}"


def collectives(backend: str, workers: int, env: Callable[[Context], dict] | None = None):
    """The all-reduce benchmark on `backend`; its tensors must live on the GPU."""

    def run(ctx: Context) -> str | None:
        name = f"collectives-{backend}"
        out = ctx.out / name / "collectives.json"
        out.unlink(missing_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            ctx.python,
            "-m",
            "trainscale.runners.collectives",
            "--backend",
            backend,
            "--device",
            "cuda",
        ]
        cmd += ["--workers", str(workers), "--max-bytes", str(1 << 22), "--warmup", "2"]
        cmd += ["--iters", "5", "--study", "gpu-check", "--out", str(out)]
        cmd += ["--timeout-minutes", str(ctx.timeout_minutes)]
        extra = env(ctx) if env else {}
        p = subprocess.run(
            cmd,
            env=child_env(**extra),
            capture_output=True,
            text=True,
            timeout=ctx.timeout_minutes * 60 + 60,
        )
        (out.parent / "run.log").write_text(p.stdout + p.stderr)
        if p.returncode or not out.exists():
            return f"exit {p.returncode}: {one_line((p.stdout + p.stderr)[-300:])}"
        rec = json.loads(out.read_text())
        if rec.get("status", "ok") != "ok":  # a benchmark that records its own failure
            return f"status {rec['status']}: {one_line(rec.get('error') or '')}"
        if rec["device"]["kind"] != "cuda":
            return f"all_reduce ran on {rec['device']['kind']} tensors, not CUDA tensors"
        if not all(s["p50_seconds"] > 0 for s in rec["sizes"]):
            return "a message size has no positive time"
        return None

    return run


def python_says(ctx: Context, code: str) -> str:
    """What a fresh interpreter prints for `code` (heavy imports stay out of this process)."""
    p = subprocess.run(
        [ctx.python, "-c", code], env=child_env(), capture_output=True, text=True, timeout=300
    )
    return p.stdout.strip() if p.returncode == 0 else f"error: {one_line(p.stderr[-200:])}"


def horovod_nccl_missing(ctx: Context) -> str | None:
    said = python_says(ctx, "import horovod.torch as h; print(h.nccl_built())")
    if said in ("False", "0") or said.startswith("error"):
        return f"Horovod with NCCL (horovod.torch.nccl_built() says {said})"
    return None


def tensorflow_gpu_missing(ctx: Context) -> str | None:
    said = python_says(
        ctx,
        "import os; os.environ['TF_CPP_MIN_LOG_LEVEL']='3'; import tensorflow as tf; "
        "print(len(tf.config.list_physical_devices('GPU')))",
    )
    if said.isdigit() and int(said) > 0:
        return None
    return f"TensorFlow's GPU build (this TensorFlow sees no GPU: {said})"


@dataclass(frozen=True)
class Build:
    """An optional build a GPU path needs: the module that must import, and the probe that says
    what of the build is missing (None: all there)."""

    module: str
    missing: Callable[[Context], str | None]


HOROVOD_NCCL = Build("horovod", horovod_nccl_missing)
TENSORFLOW_GPU = Build("tensorflow", tensorflow_gpu_missing)


def optional_build(name: str, what: str, strategy: str, build: Build) -> Check:
    """A path that trains `strategy` on one GPU where `build` is installed (NOT INSTALLED,
    not a failure, where it is not)."""
    return Check(
        name, what, trains(name, strategy=strategy), needs=(build.module,), probe=build.missing
    )


def deepspeed(stage: int, precision: str) -> Check:
    return Check(
        f"deepspeed-zero{stage}",
        f"DeepSpeed ZeRO-{stage}, 1 rank on NCCL, {precision}",
        trains(f"deepspeed-zero{stage}", strategy=f"deepspeed-zero{stage}", precision=precision),
        needs=("deepspeed",),
    )


CHECKS: tuple[Check, ...] = (
    *(
        Check(
            f"torch-cuda-{p}",
            f"torch on one GPU, {p}"
            + {"fp32": "", "bf16": " autocast", "fp16": " autocast + GradScaler"}[p]
            + ": synchronised step timing, NVML utilisation and energy, peak device memory",
            trains(f"torch-cuda-{p}", precision=p),
        )
        for p in ("fp32", "bf16", "fp16")
    ),
    Check(
        "torch-ddp-nccl",
        "torch-ddp, 1 rank on NCCL",
        trains("torch-ddp-nccl", strategy="torch-ddp"),
    ),
    Check(
        "torch-fsdp-nccl",
        "torch-fsdp (FSDP2), 1 rank on NCCL, bf16 mixed precision",
        trains("torch-fsdp-nccl", strategy="torch-fsdp", precision="bf16"),
    ),
    Check(
        "lightning-ddp-nccl",
        "lightning-ddp (Lightning's Trainer, strategy ddp), 1 rank on NCCL, bf16",
        trains("lightning-ddp-nccl", strategy="lightning-ddp", precision="bf16"),
        needs=("lightning",),
    ),
    Check(
        "torch-ddp-gloo-shared-gpu",
        "torch-ddp, 2 ranks sharing one GPU (NCCL refuses that; gloo must be used)",
        trains("torch-ddp-gloo-shared-gpu", one_gpu, strategy="torch-ddp", workers=2),
    ),
    deepspeed(0, "fp32"),
    deepspeed(1, "bf16"),
    deepspeed(2, "fp16"),
    deepspeed(3, "bf16"),
    Check(
        "collectives-nccl",
        "all-reduce benchmark on NCCL, 1 rank, CUDA tensors",
        collectives("nccl", 1),
    ),
    Check(
        "collectives-gloo-cuda",
        "all-reduce benchmark on gloo, 2 ranks sharing one GPU, CUDA tensors",
        collectives("gloo", 2, one_gpu),
    ),
    Check(
        "torch-pipeline-2-stages",
        "torch-pipeline, 2 stages over NCCL on 2 GPUs; on a one-GPU node, the clear refusal "
        "of 2 stages on one GPU (gloo cannot send CUDA tensors point to point)",
        pipeline_two_stages,
    ),
    Check(
        "torch-tp-shared-gpu",
        "torch-tp, 2 ranks pinned to one GPU: dropped by the planner with its reason, refused "
        "by the runner with it when launched anyway (no crash in DTensor over gloo)",
        tp_shared_gpu,
    ),
    Check(
        "cuda-oom",
        "CUDA out of memory (VGG19, 224², batch 8192) -> status oom with the allocator's "
        "message; the next run on the GPU unaffected",
        oom_then_ok,
    ),
    optional_build(
        "horovod-torch-nccl", "horovod-torch, 1 rank, NCCL build", "horovod-torch", HOROVOD_NCCL
    ),
    optional_build("tensorflow-gpu", "tf (Keras model.fit) on one GPU", "tf", TENSORFLOW_GPU),
)
#: Paths that may be NOT INSTALLED on a node (optional builds); every other one must run.
OPTIONAL: frozenset[str] = frozenset({"horovod-torch-nccl", "tensorflow-gpu"})


def names() -> list[str]:
    return [c.name for c in CHECKS]


def by_name(name: str) -> Check:
    for c in CHECKS:
        if c.name == name:
            return c
    raise KeyError(f"no GPU check {name!r}; the checks are: {', '.join(names())}")

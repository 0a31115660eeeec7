"""Will it fit? Every run's memory per rank, predicted before any job (config `memory:`), and
the cells over the limit dropped with the reason.

The prediction of one run (its peak bytes per rank, in parts, and how it was made) comes from a
child process, trainscale.runners.torch.memory_trace, which traces a fake training step through
the runner's own wrapping code; this module, like the Snakefile's process, imports no torch.
Each answer is cached under `.cache/trainscale/memory/` by everything that decides it: the run
spec's fields that change memory (not its repeat, seed, learning rate or epochs), the target
device, the estimator's and the models' source files, and the user's model sources. A failing
answer is never cached. The child is given a request file and an answer file: what a user's
model prints goes to its log, never into the answer.

Config `memory:` (docs/memory.md):
- limit_gib: memory per device; by default the total memory of the first GPU where Snakemake
  runs (NVML); on a CPU study, or where the planner has no GPU (a SLURM login node), give it.
- headroom: the share of the limit a cell may use (0.9).
- check: drop (cells over limit × headroom are dropped before any job, one reason each, with
  the nearest cells of the matrix that fit), warn (listed, kept) or off (nothing predicted).
  The default is drop on accelerator cuda (where no GPU is visible to read the limit from,
  as on a SLURM login node, each cell is predicted and none dropped until limit_gib is
  given), off on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from trainscale.plan import child
from trainscale.plan.runspec import MATRIX_KEYS, ConfigError, Dropped, RunSpec

CACHE = Path(".cache") / "trainscale" / "memory"
WORKFLOW = Path(__file__).resolve().parents[2]
#: bumped when the method changes, so older cached answers are not read
VERSION = 2
#: the estimator and what it builds and wraps: an edit to any predicts again
SOURCES = (
    "trainscale/runners/torch/memory_trace.py",
    "trainscale/runners/torch/pytorch.py",
    "trainscale/runners/torch/tp_plans.py",
    "trainscale/runners/torch/pipeline.py",
    "trainscale/runners/torch/deepspeed_zero.py",
    "trainscale/runners/torch/torch_parts.py",
    "trainscale/models",
)
#: run spec fields that do not change a step's memory
IGNORED = frozenset(
    ("study", "repeat", "seed", "epochs", "lr", "base_lr", "lr_scaling", "betas", "eps",
     "weight_decay", "timeout_minutes", "target_accuracy", "data_dir", "fault",
     "horovod_timeline", "steps_per_epoch", "eval_tokens", "samples", "loader_workers",
     "threads_per_worker", "scale", "compile", "deepspeed_config", "fused")
)  # fmt: skip
GIB = 2**30
TIMEOUT_SECONDS = 1800


@dataclass(frozen=True)
class Check:
    """Config `memory:` resolved: the bytes a cell may use, and what to do over them."""

    mode: str  # drop, warn or off
    limit_gib: float | None
    headroom: float
    source: str  # where limit_gib comes from: "memory.limit_gib" or the GPU read

    @property
    def allowed_bytes(self) -> float | None:
        return None if self.limit_gib is None else self.limit_gib * GIB * self.headroom

    def describe(self) -> str:
        if self.limit_gib is None:
            return "none"
        return f"{self.allowed_bytes / GIB:.3g} GiB ({self.limit_gib:g} × {self.headroom:g})"


def gpu_memory_gib() -> tuple[float, str] | None:
    """(total memory of the first NVIDIA GPU here in GiB, its name), through NVML; None
    without a GPU or NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    return total / GIB, name.decode() if isinstance(name, bytes) else str(name)


def resolve(config: dict, accelerator: str, show: bool = False) -> Check:
    """Config `memory:` with its defaults; ConfigError naming the key where it cannot hold.
    `show`: predict even where memory.check is off, against no limit unless one is given
    (trainscale check)."""
    m = config.get("memory") or {}
    mode = m.get("check") or ("drop" if accelerator == "cuda" else "off")
    headroom = m.get("headroom", 0.9)
    limit, source = m.get("limit_gib"), "memory.limit_gib"
    if show and mode == "off":
        return Check("warn", limit, headroom, source)
    if mode != "off" and limit is None:
        found = gpu_memory_gib() if accelerator == "cuda" else None
        if found is None and not m.get("check") and accelerator == "cuda":
            print(
                "trainscale: memory: no GPU where Snakemake runs to read the devices' memory "
                "from (a login node?): each cell's memory is predicted, none dropped; set "
                "memory.limit_gib to drop the cells that cannot fit",
                file=sys.stderr,
            )
            return Check("warn", None, headroom, "none")
        if found is None:
            where = "a CPU study has no device memory to read" if accelerator != "cuda" else (
                "no GPU is visible where Snakemake runs (a login node?)"
            )  # fmt: skip
            raise ConfigError(
                f"memory.limit_gib: {where}; give the memory of one device in GiB (80 for an "
                f"H100 80GB), or set memory.check: off (memory.check is {mode})"
            )
        limit, source = round(found[0], 2), f"{found[1]} (NVML)"
    return Check(mode, limit, headroom, source)


def _sources(spec: RunSpec) -> list[Path]:
    files = []
    for rel in SOURCES:
        p = WORKFLOW / rel
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    if spec.own_model is not None:
        for folder in spec.own_model.code:
            files += sorted(Path(folder).rglob("*.py"))
    return files


def key(spec: RunSpec, target: str, fingerprints: dict | None = None) -> str:
    """The cache key of `spec`'s prediction on `target`: what decides it, and nothing else."""
    fields = {k: v for k, v in spec.to_dict().items() if k not in IGNORED}
    own = spec.own_model.code if spec.own_model is not None else ()
    memo = {} if fingerprints is None else fingerprints
    if own not in memo:
        memo[own] = child.sources_digest(_sources(spec))
    text = json.dumps([VERSION, target, fields, memo[own]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def predict(runs: list[RunSpec], target: str) -> dict[str, dict]:
    """{run path: answer} for every run: from the cache, or from one child for the rest. An
    answer is {total_bytes, parts, method, traced_on, seconds} or {error}."""
    memo: dict = {}
    keys = {r.path: key(r, target, memo) for r in runs}
    answers: dict[str, dict] = {}
    asked: dict[str, dict] = {}
    for r in runs:
        k = keys[r.path]
        cached = CACHE / f"{k}.json"
        if k in answers or k in asked:
            continue
        if cached.is_file():
            answers[k] = json.loads(cached.read_text())
        else:
            asked[k] = r.to_dict()
    if asked:
        fresh = _ask_child(asked, target)
        for k, a in fresh.items():
            if "error" not in a:
                (CACHE / f"{k}.json").write_text(json.dumps(a, sort_keys=True))
        answers.update(fresh)
    return {path: answers[k] for path, k in keys.items()}


def _ask_child(asked: dict[str, dict], target: str) -> dict[str, dict]:
    """The estimate of every cell in `asked` from one child (trainscale.plan.child)."""
    log = CACHE / "last-estimate.log"
    own = {c for d in asked.values() if d.get("own_model") for c in d["own_model"]["code"]}
    print(f"trainscale: predicting the memory of {len(asked)} cells (log: {log})", file=sys.stderr)
    answer, why = child.ask("trainscale.runners.torch.memory_trace",
                            {"target": target, "runs": asked}, log, sorted(own),
                            TIMEOUT_SECONDS)  # fmt: skip
    if answer is None:
        raise ConfigError(f"memory: the estimate of {len(asked)} cells stopped: {why} (log: {log})")
    return answer


def block(answer: dict, check: Check, spec: RunSpec) -> dict:
    """The record's `memory.predicted`: the answer, and the limit it was held against."""
    out = {k: answer.get(k) for k in ("total_bytes", "parts", "method", "traced_on", "stage")}
    out = {k: v for k, v in out.items() if v is not None or k in ("total_bytes", "method")}
    out["error"] = answer.get("error")
    if spec.compile:
        out["note"] = "compile is not traced: the eager step's memory"
    out["limit_bytes"] = int(check.limit_gib * GIB) if check.limit_gib is not None else None
    out["headroom"] = check.headroom
    return out


def fit(
    check: Check, runs: list[RunSpec], dropped: list[Dropped], target: str
) -> tuple[list[RunSpec], list[Dropped], dict[str, dict]]:
    """The runs that fit (all of them unless memory.check is drop), the dropped ones with the
    reason, and every run's `memory.predicted` block by path. Nothing is predicted when
    memory.check is off. Each prediction is printed where the answer is read."""
    if check.mode == "off" or not runs:
        return runs, dropped, {}
    answers = predict(runs, target)
    if check.allowed_bytes is None:  # only shown (trainscale check on a study that has none)
        return runs, dropped, {r.path: block(answers[r.path], check, r) for r in runs}
    allowed = check.allowed_bytes
    over = {p for p, a in answers.items() if a.get("total_bytes", 0) > allowed}
    fits = [r for r in runs if r.path not in over]
    notes, seen = [], set()
    for r in runs:
        a = answers[r.path]
        if "error" in a:
            notes.append(f"memory of {r.path} not predicted: {a['error']}")
        if r.path not in over or r.cell in seen:
            continue
        seen.add(r.cell)
        why = over_reason(r, a["total_bytes"], check, fits)
        if check.mode == "drop":
            dropped.append(Dropped({k: getattr(r, k) for k in MATRIX_KEYS}, why))
        else:
            notes.append(f"{why} (memory.check: warn, kept)")
    kept = fits if check.mode == "drop" else runs
    for line in notes:
        print(f"trainscale: memory: {line}", file=sys.stderr)
    if not kept:
        raise ConfigError(
            f"memory: every cell is over {check.describe()} per device: "
            + "; ".join(d.reason for d in dropped[-3:])
        )
    return kept, dropped, {r.path: block(answers[r.path], check, r) for r in runs}


def over_reason(r: RunSpec, need: int, check: Check, fits: list[RunSpec]) -> str:
    """Why `r` is dropped, and the nearest cells of the matrix that fit."""
    return (
        f"{r.strategy} {r.model} batch {r.batch_size}: needs {need / GIB:.3g} GiB per rank, "
        f"over {check.describe()}; {nearest(r, fits)}"
    )


def nearest(r: RunSpec, fits: list[RunSpec]) -> str:
    """The nearest fitting cells of the same model, data and precision: the largest smaller
    batch of the same strategy and world, other strategies at the same batch and world, and
    the same strategy on more workers."""
    same = [o for o in fits if (o.model, o.dataset, o.seq_len, o.precision, o.batch_mode)
            == (r.model, r.dataset, r.seq_len, r.precision, r.batch_mode)]  # fmt: skip
    hints = []
    smaller = [o.batch_size for o in same if o.strategy == r.strategy and o.batch_size
               < r.batch_size and (o.world_size, o.tp) == (r.world_size, r.tp)]  # fmt: skip
    if smaller:
        hints.append(f"fits at batch {max(smaller)}")
    others: dict[str, int] = {}  # another strategy -> the fewest workers it fits on
    for o in same:
        if o.strategy == r.strategy or o.batch_size != r.batch_size:
            continue
        if r.world_size <= o.world_size < others.get(o.strategy, 1 << 30):
            others[o.strategy] = o.world_size
    nearest_others = sorted(others.items(), key=lambda kv: (kv[1], kv[0]))[:2]
    hints += [f"with {s} at {workers(n)}" for s, n in nearest_others]
    wider = sorted({o.world_size for o in same if o.strategy == r.strategy
                    and o.batch_size == r.batch_size and o.world_size > r.world_size})  # fmt: skip
    if wider:
        hints.append(f"at {workers(wider[0])}")
    if not hints:
        return (
            "no cell of this model in the matrix fits: a smaller batch_size, more workers, or "
            "a sharding strategy (torch-fsdp, deepspeed-zero3) may"
        )
    text = ", or ".join(hints)
    return text if text.startswith("fits") else "fits " + text


#: the environment variable that tells a run's launcher where the study's predictions are
INDEX_ENV = "TRAINSCALE_MEMORY_INDEX"


def write_index(study: str, predicted: dict[str, dict], runs: list[RunSpec]) -> Path | None:
    """Each run's `memory.predicted` with its spec's digest, in one file per study, for the
    launcher (`recorded`); None (and no file) where nothing was predicted. The Snakefile puts
    the path in INDEX_ENV, which its jobs inherit."""
    path = CACHE / f"study-{study}.json"
    if not predicted:
        path.unlink(missing_ok=True)
        return None
    index = {r.path: {"spec": digest(r), "predicted": predicted[r.path]} for r in runs}
    text = json.dumps(index, sort_keys=True)
    if not path.is_file() or path.read_text() != text:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        tmp.write_text(text)
        tmp.replace(path)
    return path.resolve()


def digest(spec: RunSpec) -> str:
    return hashlib.sha256(spec.to_json().encode()).hexdigest()[:16]


def recorded(spec: RunSpec) -> dict | None:
    """The run's `memory.predicted`, where the workflow that launched it predicted it for
    exactly this spec (None: not launched by a workflow that did)."""
    where = os.environ.get(INDEX_ENV)
    try:
        entry = json.loads(Path(where).read_text()).get(spec.path) if where else None
    except (OSError, ValueError):
        return None
    return entry["predicted"] if entry and entry["spec"] == digest(spec) else None


def workers(n: int) -> str:
    return f"{n} worker{'s' * (n != 1)}"

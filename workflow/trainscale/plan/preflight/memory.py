"""Will it fit? Every run's memory per rank, predicted before any job (config `memory:`), and
the cells over the limit dropped with the reason.

The prediction of one run (its peak bytes per rank, in parts, and how it was made) comes from a
child process, trainscale.runners.torch.memory.trace, which traces a fake training step through
the runner's own wrapping code; this module, like the Snakefile's process, imports no torch.
Each answer is cached under `.cache/trainscale/memory/` by everything that decides it: the run
spec's fields that change memory (not its repeat, seed, learning rate or epochs), the target
device and where the trace runs (`traced_on`), every trainscale module the trace imports (found
by reading the imports, grimp), the torch, transformers and DeepSpeed versions, the DeepSpeed
fragment's text, and the user's model sources. A failing answer is never cached; an answer is
written whole or not at all. The child is given a request file and an answer file: what a
user's model prints goes to its log, never into the answer.

Each rank's host memory (`host_bytes`) is predicted for every cell whatever memory.check says: it is
arithmetic on the build and the parameter count (trainscale.plan.preflight.memory_parts), and the
SLURM request follows it. A DeepSpeed or Horovod cell's whole-model replica (the exposed-
communication step, trainscale.runners.torch.exposed) is predicted as the `torch` cell at its
micro-batch (`replica_bytes`); the runner skips that step where it would not fit.

Config `memory:` (docs/memory.md):
- limit_gib: memory per device; by default the total memory of the first GPU where Snakemake
  runs (NVML); on a CPU study, or where the planner has no GPU (a SLURM login node), give it.
- headroom: the share of the limit a cell may use (0.9).
- check: drop (cells over limit × headroom are dropped before any job, one reason each, with
  the nearest cells of the matrix that fit), warn (listed, kept) or off (nothing predicted).
  The default is drop on accelerator cuda (where no GPU is visible to read the limit from,
  as on a SLURM login node, each cell is predicted and none dropped until limit_gib is
  given), off on CPU.
- host_limit_gib: memory of one node; a cell whose ranks on a node need more host memory is
  dropped (warn: kept), none by default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from trainscale.plan.preflight import child, memory_key, memory_parts
from trainscale.plan.runspec import ConfigError, RunSpec
from trainscale.plan.studyconfig import Memory

CACHE = Path(".cache") / "trainscale" / "memory"
WORKFLOW = Path(__file__).resolve().parents[3]
#: bumped when the method changes, so older cached answers are not read
VERSION = 5
GIB = 2**30
TIMEOUT_SECONDS = 1800


@dataclass(frozen=True)
class Check:
    """Config `memory:` resolved: the bytes a cell may use, and what to do over them."""

    mode: str  # drop, warn or off
    limit_gib: float | None
    headroom: float
    source: str  # where limit_gib comes from: "memory.limit_gib" or the GPU read
    host_limit_gib: float | None = None  # memory.host_limit_gib: one node's memory

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


def resolve(given: Memory, accelerator: str, show: bool = False) -> Check:
    """Config `memory:` (its defaults filled) resolved; ConfigError naming the key where it
    cannot hold. `show`: predict even where memory.check is off, against no limit unless one
    is given (trainscale check)."""
    mode = given.check or ("drop" if accelerator == "cuda" else "off")
    headroom = given.headroom
    limit, source = given.limit_gib, "memory.limit_gib"
    host = given.host_limit_gib
    if show and mode == "off":
        return Check("warn", limit, headroom, source, host)
    if mode != "off" and limit is None:
        found = gpu_memory_gib() if accelerator == "cuda" else None
        if found is None and not given.check and accelerator == "cuda":
            print(
                "trainscale: memory: no GPU where Snakemake runs to read the devices' memory "
                "from (a login node?): each cell's memory is predicted, none dropped; set "
                "memory.limit_gib to drop the cells that cannot fit",
                file=sys.stderr,
            )
            return Check("warn", None, headroom, "none", host)
        if found is None:
            where = "a CPU study has no device memory to read" if accelerator != "cuda" else (
                "no GPU is visible where Snakemake runs (a login node?)"
            )  # fmt: skip
            raise ConfigError(
                f"memory.limit_gib: {where}; give the memory of one device in GiB (80 for an "
                f"H100 80GB), or set memory.check: off (memory.check is {mode})"
            )
        limit, source = round(found[0], 2), f"{found[1]} (NVML)"
    return Check(mode, limit, headroom, source, host)


def predict(runs: list[RunSpec], target: str) -> dict[str, dict]:
    """{run path: answer} for every run: from the cache, or from one child for the rest. An
    answer is {total_bytes, parts, method, traced_on, seconds} or {error}."""
    memo: dict = {}
    keys = {r.path: memory_key.key(r, target, VERSION, memo) for r in runs}
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
            if "error" not in a:  # whole or absent: a reader never meets half an answer
                tmp = CACHE / f"{k}.{os.getpid()}.partial"
                tmp.write_text(json.dumps(a, sort_keys=True))
                tmp.replace(CACHE / f"{k}.json")
        answers.update(fresh)
    return {path: answers[k] for path, k in keys.items()}


def _ask_child(asked: dict[str, dict], target: str) -> dict[str, dict]:
    """The estimate of every cell in `asked` from one child (trainscale.plan.preflight.child)."""
    log = CACHE / "last-estimate.log"
    own = {c for d in asked.values() if d.get("own_model") for c in d["own_model"]["code"]}
    print(f"trainscale: predicting the memory of {len(asked)} cells (log: {log})", file=sys.stderr)
    answer, why = child.ask("trainscale.runners.torch.memory.trace",
                            {"target": target, "runs": asked}, log, sorted(own),
                            TIMEOUT_SECONDS)  # fmt: skip
    if answer is None:
        raise ConfigError(f"memory: the estimate of {len(asked)} cells stopped: {why} (log: {log})")
    return answer


def replica_spec(spec: RunSpec) -> RunSpec | None:
    """The `torch` cell at the micro-batch of a DeepSpeed or Horovod cell of several workers:
    the whole-model replica its exposed-communication step builds and steps (None for other
    cells)."""
    if spec.world_size == 1 or not spec.strategy.startswith(("deepspeed-", "horovod-")):
        return None
    micro = spec.per_worker_batch_size // spec.grad_accum
    return dataclasses.replace(
        spec, strategy="torch", workers=1, nodes=1, world_size=1, batch_size=micro,
        batch_mode="global", global_batch_size=micro, per_worker_batch_size=micro,
        grad_accum=1, offload="none", deepspeed_config=None,
    )  # fmt: skip


def block(answer: dict | None, check: Check, spec: RunSpec, target: str,
          replica: dict | None = None) -> dict:  # fmt: skip
    """The record's `memory.predicted`: the answer (None: not traced, memory.check off), the
    limit it was held against, the host bytes per rank, and the replica's bytes."""
    answer = answer or {"method": None}
    keys = ("total_bytes", "reserved_bytes", "parts", "method", "traced_on", "stage")
    out = {k: answer.get(k) for k in keys}
    out = {k: v for k, v in out.items() if v is not None or k in ("total_bytes", "method")}
    out["error"] = answer.get("error")
    if spec.compile:
        out["note"] = "compile is not traced: the eager step's memory"
    out["limit_bytes"] = int(check.limit_gib * GIB) if check.limit_gib is not None else None
    out["headroom"] = check.headroom
    states = ({"host": answer["host_offload_bytes"]} if "host_offload_bytes" in answer
              else None)  # fmt: skip
    traced = answer if answer.get("total_bytes") is not None else None
    out["host_bytes"], out["host_parts"] = memory_parts.host(spec, target, traced, states)
    if replica is not None:
        out["replica_bytes"] = replica.get("total_bytes")
    return out


def need(answer: dict) -> int:
    """The bytes a cell needs on its device: the reserved side (its tensors' peak, the CUDA
    runtime and NCCL), which is the allocated peak on CPU."""
    return answer.get("reserved_bytes") or answer.get("total_bytes") or 0


def replica_skipped(predicted: dict | None) -> str | None:
    """Why the exposed-communication step's whole-model replica is not built (None: build
    it): the replica's predicted peak with what the run still holds (its parameters,
    optimizer state, buckets, the CUDA runtime and NCCL) over the limit × headroom."""
    p = predicted or {}
    if p.get("replica_bytes") is None or p.get("limit_bytes") is None:
        return None
    parts = p.get("parts") or {}
    held = sum(parts.get(k) or 0 for k in ("parameters", "optimizer", "model_states",
                                           "communication", "runtime", "nccl"))  # fmt: skip
    allowed = p["limit_bytes"] * p["headroom"]
    if held + p["replica_bytes"] <= allowed:
        return None
    return (
        f"not measured: its whole-model replica (the torch cell at the micro-batch, predicted "
        f"{p['replica_bytes'] / GIB:.3g} GiB) beside what the run holds ({held / GIB:.3g} GiB) "
        f"is over {allowed / GIB:.3g} GiB (memory.limit_gib × headroom); no allocation tried"
    )


#: the environment variable that tells a run's launcher where the study's predictions are
INDEX_ENV = "TRAINSCALE_MEMORY_INDEX"


def write_index(study: str, predicted: dict[str, dict], runs: list[RunSpec]) -> Path | None:
    """Each run's `memory.predicted` with its spec's digest, in one file per study, for the
    launcher (`recorded`); None (and no file) where nothing was predicted. The Snakefile puts
    the path in INDEX_ENV, which its jobs inherit."""
    path = CACHE / f"study-{study}.json"
    if not predicted:  # no runs
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

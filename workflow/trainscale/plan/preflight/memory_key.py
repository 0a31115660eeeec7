"""The cache key of a memory prediction (trainscale.plan.preflight.memory): everything that decides
the answer, and nothing else. The run spec's fields that change memory, the target and where the
trace runs, every trainscale module the estimator imports (read from the source by grimp, so an edit
to any of them, or to a module added later, predicts again), the versions of the libraries it traces
through, a DeepSpeed fragment's text, and the user's model sources. Imports no torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import metadata
from pathlib import Path

from trainscale.plan.machine import visible_gpus
from trainscale.plan.preflight import child
from trainscale.plan.runspec import RunSpec

WORKFLOW = Path(__file__).resolve().parents[3]
#: the estimator: it and every trainscale module it imports decide an answer (trace_modules)
TRACE_MODULE = "trainscale.runners.torch.memory.trace"
#: the libraries whose versions decide an answer
PACKAGES = ("torch", "transformers", "deepspeed")
#: run spec fields that do not change a step's memory
IGNORED = frozenset(
    ("study", "repeat", "seed", "epochs", "lr", "base_lr", "lr_scaling", "betas", "eps",
     "weight_decay", "timeout_minutes", "target_accuracy", "data_dir", "fault",
     "horovod_timeline", "steps_per_epoch", "eval_tokens", "samples", "loader_workers",
     "threads_per_worker", "scale", "compile")
)  # fmt: skip


@functools.cache
def trace_modules(*roots: str) -> tuple[str, ...]:
    """Every trainscale module `roots` import, directly or not, and the roots: read from
    their source (grimp's import graph), nothing imported."""

    graph = _graph()
    found = set(roots)
    for root in roots:
        found |= graph.find_upstream_modules(root)
    return tuple(sorted(found))


@functools.cache
def _graph():
    import grimp

    return grimp.build_graph("trainscale", cache_dir=None)


def module_file(name: str) -> Path:
    """The source file of trainscale module `name`."""
    base = WORKFLOW / name.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _sources(spec: RunSpec) -> list[Path]:
    """The files a prediction of `spec` depends on: the estimator's imports, a builder of
    trainscale's that `models:` names (an `hf:` model's) with its imports, the user's code."""
    roots = [TRACE_MODULE]
    own = spec.own_model
    if own is not None:
        named = (own.torch, own.tp_plan, own.init)
        roots += [n.split(":")[0] for n in named if n and n.startswith("trainscale.")]
    files = [module_file(m) for m in trace_modules(*sorted(set(roots)))]
    for folder in own.code if own is not None else ():
        files += sorted(Path(folder).rglob("*.py"))
    return [f for f in files if f.is_file()]


@functools.cache
def versions() -> dict[str, str | None]:
    """The installed versions of PACKAGES (None where one is not installed)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@functools.cache
def traced_on(target: str) -> str:
    """Where the child traces a run for `target`: on fake CUDA tensors where a GPU is here,
    else on fake CPU tensors (memory_trace.trace_device), as NVML sees it, without torch."""
    return "cuda" if target == "cuda" and visible_gpus() else "cpu"


def sources_version(root: str) -> str:
    """A short digest of trainscale module `root`'s sources (it and every module it imports,
    trace_modules) and torch's version: part of the key of an answer that `root` computes and a
    study keeps (the Keras runs' torch-twin FLOP count), so an edit to its code computes again."""
    files = [module_file(m) for m in trace_modules(root)]
    digest = child.sources_digest(f for f in files if f.is_file())
    return f"{digest[:16]}:torch={versions()['torch']}"


def file_digest(path: str | None) -> str | None:
    """The text of a file a spec names (its DeepSpeed fragment), as a digest."""
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None  # the runner names the missing file; the planner predicts without it


def key(spec: RunSpec, target: str, version: int, fingerprints: dict | None = None) -> str:
    """The cache key of `spec`'s prediction on `target`: what decides it, and nothing else."""
    fields = {k: v for k, v in spec.to_dict().items() if k not in IGNORED}
    own = spec.own_model
    memo = {} if fingerprints is None else fingerprints
    which = (own.code, own.torch, own.tp_plan, own.init) if own is not None else ()
    if which not in memo:
        memo[which] = child.sources_digest(_sources(spec))
    text = json.dumps(
        [version, target, traced_on(target), fields, memo[which], versions(),
         file_digest(spec.deepspeed_config)], sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:32]

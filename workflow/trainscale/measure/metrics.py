"""Run metrics: what is measured, how derived figures are computed, and how they are written.

Every per-run figure of metrics.json is computed here, once; docs/methods.md ("Per run") defines
each, and the report shows that page as its Methods.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import resource
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import orjson
import yaml

import trainscale
from trainscale.data import imagesets
from trainscale.measure import (
    classes,
    datawait,
    divergence,
    flops,
    metrics_types,
    node_state,
    timeline,
    variables,
)
from trainscale.measure.device_usage import (  # noqa: F401  (runners call metrics.GpuMonitor)
    GpuMonitor,
)
from trainscale.measure.steptimes import batch_means, percentile
from trainscale.plan import catalog

SCHEMA_ID = "trainscale.metrics/1"
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "metrics.schema.yaml"
STATUSES = ("ok", "failed", "oom", "timeout", "diverged")


class MetricsError(ValueError):
    """A metrics file that is not valid JSON or does not follow the schema."""


@functools.cache
def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


@functools.cache
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(_schema())


@functools.cache
def _fast_check():
    """A compiled validator (fastjsonschema) for the common case of a valid record: about 50×
    faster than jsonschema, which matters when a report reads 10,000 files. It only says
    valid or not; the detailed message comes from jsonschema."""
    import fastjsonschema

    schema = {k: v for k, v in _schema().items() if k not in ("$schema", "$id", "$defs")}
    return fastjsonschema.compile(_inline_refs(schema, _schema()["$defs"]))


def _inline_refs(node: object, defs: dict) -> object:
    """`node` with each `$ref: "#/$defs/x"` replaced by x itself: fastjsonschema calls a
    function per reference and formats its error path eagerly, which tripled the time a
    metrics file with a few epochs takes to check."""
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = {**defs[node["$ref"].rsplit("/", 1)[1]], **node}
        del ref["$ref"]
        return _inline_refs(ref, defs)
    return {k: _inline_refs(v, defs) for k, v in node.items()}


def validate(record: dict) -> None:
    """Raise MetricsError listing every place `record` breaks the metrics schema."""
    try:
        _fast_check()(record)
        return
    except Exception:  # fastjsonschema.JsonSchemaException, or anything odd in the record
        pass
    errors = sorted(_validator().iter_errors(record), key=lambda e: list(e.path))
    if errors:
        msgs = [f"{'/'.join(map(str, e.path)) or '<top>'}: {e.message}" for e in errors[:5]]
        raise MetricsError("; ".join(msgs))


def parse(data: bytes) -> Any:
    """JSON text as Python values: orjson, about three times as fast as json on a metrics
    file (a report reads 100,000 of them); json where orjson refuses what json reads and
    `write` may have written (NaN and Infinity, a byte-order mark), so a file neither reads
    gets json's error message. (orjson reads an integer beyond 64 bits as a float: no count
    in a metrics file comes near.)"""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


@functools.cache
def _typed_check():
    """The schema as msgspec types (trainscale.measure.metrics_types): parse and check in one
    C call; None where the schema says what they cannot."""
    return metrics_types.decoder(_schema())


_as_values = msgspec.json.Decoder().decode


def build_checks() -> None:
    """Build what `read` checks with, once (a pool forked after it inherits them): the types,
    or where the schema says what they cannot, the compiled validator."""
    if _typed_check() is None:
        _fast_check()


def read(path: str | Path) -> dict:
    """Load and validate one metrics file: checked by the schema's msgspec types, then parsed
    (two passes in C: a quarter of orjson and the compiled validator's time); a file they refuse
    (NaN, 2.0 for an integer) is validated as `write` validates, whose verdict stands."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        checked = _typed_check()
        if checked is not None:
            try:
                checked(data)
            except msgspec.DecodeError:
                pass
            else:
                return _as_values(data)
        record = parse(data)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise MetricsError(f"{path}: not readable JSON ({e})") from e
    try:
        validate(record)
    except MetricsError as e:
        raise MetricsError(f"{path}: {e}") from e
    return record


def write(path: str | Path, record: dict) -> None:
    """Validate, then write atomically (temp file in the same directory + rename).

    A reader (or Snakemake after a crash) sees either the old file, no file, or the whole new
    one, never a partial file.
    """
    validate(record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".metrics.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cpu_count() -> int:
    """CPUs this process may run on (affinity, as SLURM and taskset restrict it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def oversubscribed(
    workers_per_node: int, threads_per_worker: int, cores: int, loader_workers: int = 0
) -> bool:
    """True when a node's workers, with their data-loader processes, ask for more threads
    than it has cores."""
    return workers_per_node * (threads_per_worker + loader_workers) > cores


def environment(start_utc: str, frameworks: dict[str, str], hostnames: list[str]) -> dict:
    """The `env` block: where and with what the run ran. `hostnames` is one per rank, in rank
    order (SLURM's node name under srun): kept as `rank_hosts`, and as the set of hosts."""
    return {
        "hostnames": sorted(set(hostnames)),
        "rank_hosts": list(hostnames),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "python": platform.python_version(),
        "frameworks": frameworks,
        "cuda": None,
        "driver": None,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cpu_count": cpu_count(),
        "rank_cpus": [cpu_count()],  # the runners' gathers give every rank's
        "start_utc": start_utc,
        "end_utc": utc_now(),
        "trainscale": trainscale.__version__,
        "variables": variables.seen(),
        # the transport from NCCL's lines, which the supervisor sees (trainscale.launch.supervise)
        "nccl": {"version": variables.nccl_version(), "transport": None},
        "container": None,  # the launcher's to say (trainscale.launch.container)
        "gpus": [],  # each node's GPUs (node_state): Recorder.record, or the runner's gather
    }


def hostname() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def driver_version() -> str | None:
    """The NVIDIA driver version through NVML, or None where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:
        return None


def launch_info() -> dict:
    """What the launcher told the workers about itself (TRAINSCALE_LAUNCH, set by the
    supervisor)."""
    raw = os.environ.get("TRAINSCALE_LAUNCH")
    info = json.loads(raw) if raw else {}
    return {"command": info.get("command"), "mode": info.get("mode"), "exit_code": None}


#: Strategies whose runs cannot switch gradient synchronisation off, and why: their multi-worker
#: runs record `communication` with null figures and this reason.
NO_EXPOSED_MEASUREMENT = catalog.exposed_unmeasured()


def not_measured_communication(strategy: str) -> dict:
    """The `communication` block of a multi-worker run whose runner measured none."""
    why = NO_EXPOSED_MEASUREMENT.get(strategy, f"{strategy}: not measured by its runner")
    return {
        "compute_seconds_per_step": None,
        "step_seconds_per_step": None,
        "exposed_seconds_per_step": None,
        "method": None,
        "steps": 0,
        "note": why,
    }


class Recorder:
    """Collects a run's measurements on rank 0 and turns them into one metrics record."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        #: where the run's time goes outside its epochs (the record's `timeline`)
        self.timeline = timeline.Timeline()
        self.t0 = time.perf_counter()
        self.start_utc = utc_now()
        self.setup_seconds: float | None = None
        self.epochs: list[dict] = []
        #: the `communication` block a runner measured (runners/torch/exposed.py), or None
        self.communication: dict | None = None
        #: the training losses seen so far; a divergence makes the record `diverged`
        self.losses = divergence.LossWatch()
        #: the parts after training that failed ({"part", "error"}: runners/guarded.py)
        self.warnings: list[dict] = []
        #: this node's GPUs as the run starts (env.gpus' `start`; [] without NVML)
        self.gpus_at_start = node_state.read()

    def node_gpus(self) -> list[dict]:
        """`env.gpus` entries of this process's node: its GPUs now and at the start."""
        return node_state.block(self.gpus_at_start, node_state.read(), hostname())

    @property
    def diverged(self) -> bool:
        return self.losses.diverged is not None

    def training_starts(self) -> None:
        self.timeline.ends("other")  # what the runner did not name (timeline.ends)
        self.setup_seconds = time.perf_counter() - self.t0

    def epoch(
        self,
        seconds: float,
        samples: int,
        steps: int,
        train_loss: float | None,
        step_seconds: list[float],
        test_accuracy: float | None = None,
        test_loss: float | None = None,
    ) -> dict:
        e = {
            "epoch": len(self.epochs) + 1,
            "seconds": seconds,
            "samples": samples,
            "steps": steps,
            "samples_per_second": samples / seconds,
            **self._tokens(samples / seconds),
            "train_loss": train_loss,
            "step_seconds_p50": percentile(step_seconds, 50),
            "step_seconds_p95": percentile(step_seconds, 95),
            "step_batch_means": batch_means(step_seconds),
            "test_accuracy": test_accuracy,
            "test_loss": test_loss,
        }
        self.epochs.append(e)
        return e

    def _tokens(self, samples_per_second: float) -> dict:
        rate = tokens_per_second(samples_per_second, self.spec.get("seq_len") or 0)
        return {} if rate is None else {"tokens_per_second": rate}

    def record(self, **parts: Any) -> dict:
        """The whole metrics record for a finished run; `parts` fill the measured blocks."""
        rec = ok_record(self.spec, self.epochs, self.spec.get("target_accuracy"))
        rec["setup_seconds"] = self.setup_seconds
        rec["wall_seconds"] = time.perf_counter() - self.t0
        rec["timeline"] = self.timeline.block()
        rec.update(parts)
        if "env" in parts and not rec["env"].get("gpus"):  # no runner gathered every node's
            rec["env"]["gpus"] = self.node_gpus()
        rec["warnings"] = list(self.warnings)
        rec["data"] = {**imagesets.data_block(self.spec), **rec["data"]}  # format, input_shape
        if self.spec.get("world_size", 1) > 1:
            rec["communication"] = self.communication or not_measured_communication(
                self.spec["strategy"]
            )
        rec["flops"] = flops.block(parts.get("flops"), rec["throughput"])
        rec["test"] = classes.per_class_block(rec["test"], self.spec)
        if imagesets.spec_info(self.spec).synthetic:  # random labels: accuracy means nothing
            rec["test"] = classes.per_class_block({"accuracy": None, "loss": None}, self.spec)
            for e in rec["epochs"]:
                e["test_accuracy"] = e["test_loss"] = None
        if self.losses.diverged is not None:
            divergence.mark(rec, self.losses.diverged)
        return rec


def derived(epochs: list[dict], world_size: int, target_accuracy: float | None) -> dict:
    """First/steady epoch time, throughput and time-to-accuracy from the epoch list."""
    steady = epochs[1:]
    first = epochs[0]["seconds"] if epochs else None
    steady_seconds = sum(e["seconds"] for e in steady)
    throughput = sum(e["samples"] for e in steady) / steady_seconds if steady else None
    tta, elapsed = None, 0.0
    for e in epochs:
        elapsed += e["seconds"]
        acc = e.get("test_accuracy")
        if target_accuracy is not None and acc is not None and acc >= target_accuracy:
            tta = elapsed
            break
    return {
        "first_epoch_seconds": first,
        "steady_epoch_seconds": steady_seconds / len(steady) if steady else None,
        "throughput": throughput,
        "throughput_per_worker": throughput / world_size if throughput is not None else None,
        "time_to_accuracy_seconds": tta,
    }


def tokens_per_second(throughput: float | None, seq_len: int) -> float | None:
    """Steady tokens/s over all workers on token data (throughput × seq_len); None on images."""
    return throughput * seq_len if throughput is not None and seq_len else None


def ok_record(spec: dict, epochs: list[dict], target_accuracy: float | None) -> dict:
    base = empty_record(spec, "ok", None)
    base["epochs"] = epochs
    base.update(derived(epochs, spec["world_size"], target_accuracy), **datawait.derived(epochs))
    base["tokens_per_second"] = tokens_per_second(base["throughput"], spec.get("seq_len") or 0)
    return base


def empty_record(spec: dict, status: str, error: str | None) -> dict:
    """A record with every measured block empty: the shape a failed run is written in."""
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "error": error,
        "spec": spec,
        "model": {"params": None},
        "data": {"train_samples": None, "test_samples": None},
        "epochs": [],
        "first_epoch_seconds": None,
        "steady_epoch_seconds": None,
        "throughput": None,
        "throughput_per_worker": None,
        "tokens_per_second": None,
        "setup_seconds": None,
        "test": {"accuracy": None, "loss": None, **dict.fromkeys(classes.PER_CLASS_KEYS)},
        "time_to_accuracy_seconds": None,
        "memory": {"peak_host_rss_bytes": None, "peak_device_bytes": None},
        "device": {
            "kind": None,
            "name": None,
            "count": None,
            "utilization_mean": None,
            "energy_joules": None,
        },
        "env": environment(utc_now(), {}, [hostname()]),
        "oversubscribed": False,
        "wall_seconds": None,
        "launch": {"command": None, "mode": None, "exit_code": None},
        "flops": flops.block(None, None),
        "warnings": [],
    }


def failure_record(
    spec: dict,
    status: str,
    error: str,
    start_utc: str,
    wall_seconds: float,
    launch: dict,
) -> dict:
    """The record the launcher writes when a run ended without writing its own."""
    rec = empty_record(spec, status, error)
    rec["env"]["start_utc"] = start_utc
    rec["wall_seconds"] = wall_seconds
    rec["launch"] = launch
    workers_node = spec["workers"]
    loaders = spec.get("loader_workers", 0)
    rec["oversubscribed"] = oversubscribed(
        workers_node, spec["threads_per_worker"], cpu_count(), loaders
    )
    return rec

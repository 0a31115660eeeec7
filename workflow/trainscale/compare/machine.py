"""A scaling card's machine and config blocks: the hosts, devices, versions and interconnect
the runs saw, and every study-wide setting of their specs; and how two cards' differ."""

from __future__ import annotations

import json
from collections.abc import Iterable

from trainscale.plan.matrix import MATRIX_KEYS

#: Spec keys that are not study-wide settings: they name the cell or the repeat, follow from
#: the cell (world size, batch per worker, the scaled learning rate), or are a local path.
NOT_CONFIG = {
    *MATRIX_KEYS,
    "repeat",
    "world_size",
    "global_batch_size",
    "per_worker_batch_size",
    "lr",
    "study",
    "data_dir",
}


def _distinct(values: Iterable[object]) -> list[str]:
    return sorted({str(v) for v in values if v is not None})


def machine(records: list[dict], coll: list[dict]) -> dict:
    """The machine block: hosts, devices, versions and the interconnect as the runs saw it."""
    hosts = {h for r in records for h in r["env"].get("hostnames", [])}
    hosts |= {h for c in coll for h in c["hosts"]}
    kinds = _distinct(r["device"]["kind"] for r in records)
    names = [(r["device"]["kind"], r["device"]["name"]) for r in records]
    cpu = _distinct(n for k, n in names if k == "cpu")
    gpu = _distinct(n for k, n in names if k == "cuda")
    versions: dict[str, set] = {}
    for r in records:
        env = r["env"]
        for key in ("python", "trainscale", "cuda", "driver"):
            if env.get(key):
                versions.setdefault(key, set()).add(str(env[key]))
        for fw, v in env.get("frameworks", {}).items():
            versions.setdefault(fw, set()).add(str(v))
    nodes = max([r["spec"]["nodes"] for r in records] + [c["nodes"] for c in coll] + [0])
    peak = {}
    for c in coll:
        peak[f"{c['backend']} {c['workers']}×{c['nodes']}"] = max(
            s["busbw_bytes_per_second"] for s in c["sizes"]
        )
    return {
        "hosts": sorted(hosts),
        "host_count": len(hosts),
        "max_nodes_per_run": nodes,
        "device_kinds": kinds,
        "cpu_models": cpu,
        "gpu_models": gpu,
        "cpus_per_node": sorted({int(r["env"]["cpu_count"]) for r in records}),
        "interconnect": {
            "seen": "single host" if nodes <= 1 else f"{nodes} hosts in one run",
            "backends": sorted({c["backend"] for c in coll}),
            "launch_modes": _distinct(r.get("launch", {}).get("mode") for r in records),
            "peak_busbw_bytes_per_second": peak,
        },
        "versions": {k: sorted(v) for k, v in sorted(versions.items())},
    }


def study_config(records: list[dict]) -> dict[str, list[str]]:
    """Every study-wide spec key -> its distinct values (strings as they are, others as JSON).
    `seed` is the study's (a run's seed is seed + repeat) and `repeats` the most any cell has."""
    out: dict[str, set] = {}
    for r in records:
        spec = dict(r["spec"])
        spec["seed"] = spec["seed"] - spec["repeat"]
        for k, v in spec.items():
            if k not in NOT_CONFIG:
                out.setdefault(k, set()).add(v if isinstance(v, str) else json.dumps(v))
    if records:
        out["repeats"] = {str(max(r["spec"]["repeat"] for r in records) + 1)}
    return {k: sorted(v) for k, v in sorted(out.items())}


def _flat_machine(card: dict) -> dict[str, str]:
    m = card["machine"]
    out = {
        "hosts": str(m["host_count"]),
        "max nodes per run": str(m["max_nodes_per_run"]),
        "devices": ", ".join(m["device_kinds"]) or "–",
        "CPU model": "; ".join(m["cpu_models"]) or "–",
        "GPU model": "; ".join(m["gpu_models"]) or "–",
        "CPUs per node": ", ".join(map(str, m["cpus_per_node"])) or "–",
        "interconnect": m["interconnect"]["seen"],
        "collective backends": ", ".join(m["interconnect"]["backends"]) or "–",
        "launch modes": ", ".join(m["interconnect"]["launch_modes"]) or "–",
    }
    for k in ("cuda", "nccl", "driver"):  # named even when not recorded: a difference shows
        out[k] = "not recorded"
    for k, v in m["versions"].items():
        out[k] = "; ".join(v)
    for k, v in card["config"].items():
        out[f"config: {k}"] = "; ".join(v)
    return out


def environment_diff(base: dict, new: dict) -> list[dict]:
    """Every machine entry and config key whose values differ (absent on one side: '–')."""
    a, b = _flat_machine(base), _flat_machine(new)
    keys = [k for k in a if k in b] + [k for k in a if k not in b] + [k for k in b if k not in a]
    return [
        {"key": k, "base": a.get(k, "–"), "new": b.get(k, "–")}
        for k in keys
        if a.get(k, "–") != b.get(k, "–")
    ]

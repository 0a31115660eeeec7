"""The network of the prediction model (trainscale/analysis/predict.py): the time of a ring
all-reduce per tier (inside a node, between nodes), from the all-reduce benchmark, a described link
(`predict.network`) or another cluster's scaling card (`predict.card`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from trainscale.analysis import aggregate
from trainscale.measure import collectives

# --------------------------------------------------------------------------------------------
# the network: latency and bandwidth of a ring, per tier


@dataclass(frozen=True)
class Link:
    """One tier of the network: a measured benchmark curve or a described link."""

    source: str
    sizes: np.ndarray | None = None  # bytes, ascending
    t50: np.ndarray | None = None  # seconds of one all-reduce at n_measured ranks
    t95: np.ndarray | None = None
    n_measured: int = 2
    bandwidth: float = math.nan  # bytes/s (described link)
    latency: float = 0.0  # seconds per ring step (described link)

    def ring_seconds(self, n: int, size: float, u: float = 0.0) -> float:
        """2(n − 1)·α + 2(n − 1)/n · size / B; u in [0, 1] reads the benchmark between its
        median (0) and 95th-percentile (1) time."""
        return float(self.ring_seconds_at(n, size, np.array([u]))[0])

    def ring_seconds_at(self, n: int, size: float, us: np.ndarray) -> np.ndarray:
        """ring_seconds at each benchmark reading of `us` at once (the bootstrap reads the
        benchmark once per resample)."""
        if n <= 1:
            return np.zeros(len(us))
        if self.sizes is None:
            t = 2 * (n - 1) * self.latency + collectives.bus_factor(n) * size / self.bandwidth
            return np.full(len(us), t)
        x = np.log2(self.sizes)
        steps = 2 * (self.n_measured - 1)
        # the time at `size` and α are linear in u (np.interp is linear in the times)
        t50, t95 = (float(np.interp(np.log2(size), x, t)) for t in (self.t50, self.t95))
        if size > self.sizes[-1]:  # past the largest size measured: bandwidth-bound, linear
            t50, t95 = (float(t[-1]) * size / float(self.sizes[-1]) for t in (self.t50, self.t95))
        t_s = t50 + us * (t95 - t50)
        alpha = (float(self.t50[0]) + us * float(self.t95[0] - self.t50[0])) / steps
        bw_time = np.maximum(t_s - steps * alpha, t_s * 1e-3)  # bandwidth part at n_measured
        per_byte = bw_time / (collectives.bus_factor(self.n_measured) * size)
        return 2 * (n - 1) * alpha + collectives.bus_factor(n) * size * per_byte


def curve_link(coll: pd.DataFrame, source: str) -> Link | None:
    """The benchmark of one (workers, nodes) shape as a Link (None without timings)."""
    c = aggregate.measured_collectives(coll).sort_values("bytes")
    if not len(c):
        return None
    return Link(
        source=source,
        sizes=c["bytes"].to_numpy(float),
        t50=c["p50_seconds"].to_numpy(float),
        t95=np.maximum(c["p95_seconds"].to_numpy(float), c["p50_seconds"].to_numpy(float)),
        n_measured=int(c["world_size"].iloc[0]),
    )


def described_link(network: dict, source: str) -> Link:
    """A link from {link_gbps, latency_us} (GB/s = 1e9 bytes/s per rank's link)."""
    try:
        gbps, lat = float(network["link_gbps"]), float(network.get("latency_us", 0.0))
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{source}: give link_gbps (GB/s of one rank's link) and latency_us, "
            "e.g. {link_gbps: 25, latency_us: 5}"
        ) from None
    if gbps <= 0 or lat < 0:
        raise ValueError(f"{source}: link_gbps must be > 0 and latency_us ≥ 0")
    return Link(source=source, bandwidth=gbps * 1e9, latency=lat * 1e-6)


def card_link(path: str) -> Link:
    """The inter-node network of another cluster's scaling card (JSON): its `network`
    {link_gbps, latency_us}, or its all-reduce rows `collectives` of a multi-node benchmark."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"predict.card: {path} does not exist; give a scaling-card JSON path")
    card = json.loads(p.read_text())
    if isinstance(card.get("network"), dict):
        return described_link(card["network"], f"scaling card {path} (network)")
    entries = card.get("collectives") or []
    # a trainscale scaling card nests each benchmark's sizes; flat rows are taken as they are
    rows = pd.DataFrame(
        [
            {**{k: v for k, v in e.items() if k != "sizes"}, **size}
            for e in entries
            for size in e["sizes"]
        ]
        if entries and "sizes" in entries[0]
        else entries
    )
    if len(rows) and {"nodes", "bytes", "p50_seconds"} <= set(rows):
        multi = rows[rows["nodes"] > 1]
        if len(multi):
            top = multi[multi["nodes"] == multi["nodes"].max()]
            top = top.assign(status="ok", p95_seconds=top.get("p95_seconds", top["p50_seconds"]))
            link = curve_link(top, f"scaling card {path} (multi-node all-reduce)")
            if link:
                return link
    raise ValueError(
        f"predict.card: {path} has neither a `network` {{link_gbps, latency_us}} nor multi-node "
        "`collectives` rows {nodes, bytes, p50_seconds, world_size}"
    )


@dataclass(frozen=True)
class Network:
    intra: Link | None
    inter: Link | None
    gpus_per_node: int
    notes: tuple[str, ...] = ()

    def link(self, nodes: int) -> Link | None:
        return self.inter if nodes > 1 else self.intra


def network(coll: pd.DataFrame, predict_cfg: dict, measured_workers: int) -> Network:
    """The two tiers from the benchmark and the `predict` config (see the module docstring)."""
    coll = aggregate.measured_collectives(coll) if len(coll) else coll
    notes = []
    intra = inter = None
    if len(coll):
        one = coll[coll["nodes"] == 1]
        if len(one):
            w = int(one["workers"].max())
            intra = curve_link(one[one["workers"] == w], f"all-reduce benchmark, {w} workers")
        multi = coll[coll["nodes"] > 1]
        if len(multi):
            n = int(multi["nodes"].max())
            sub = multi[multi["nodes"] == n]
            sub = sub[sub["workers"] == sub["workers"].max()]
            inter = curve_link(sub, f"all-reduce benchmark, {n} nodes")
    if inter is None and predict_cfg.get("network"):
        inter = described_link(predict_cfg["network"], "predict.network")
    if inter is None and predict_cfg.get("card"):
        inter = card_link(predict_cfg["card"])
    if intra is None and predict_cfg.get("network"):
        intra = described_link(predict_cfg["network"], "predict.network")
        notes.append("no 1-node all-reduce benchmark: intra-node links as predict.network")
    if intra is None:
        notes.append(
            "no all-reduce benchmark or predict.network: t_comm = 0 (communication only in t_fixed)"
        )
    if inter is None and intra is not None:
        inter = replace(intra, source=intra.source + " (used across nodes too)")
        notes.append(
            "no multi-node benchmark, predict.network or predict.card: links between nodes "
            "assumed as fast as inside one (optimistic)"
        )
    gpn = predict_cfg.get("gpus_per_node") or max(1, measured_workers)
    return Network(intra, inter, int(gpn), tuple(notes))

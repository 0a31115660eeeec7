"""A cell on one side of a comparison, as its scaling card gives it: parsed once from the card's
point (schemas/scaling-card.schema.yaml, `point`), read by name after that."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainscale.analysis.interval import STEPS

#: A card point's parts of its study's model that `trainscale compare` pools with the other
#: study's (the card's POOL).
POOL = ("pooled_run_var", "pooled_df", "between_run_var", "within_run_var", "within_run_df")


@dataclass(frozen=True)
class StepModel:
    """A point's interval model from steps and repeats (docs/methods.md): ȳ, Var(ȳ), ν, the
    repeats, and, in cards that record them, the pool's parts (None in cards made before)."""

    n: int  # ok repeats
    log_mean: float  # ȳ, the mean log throughput
    log_var: float  # Var(ȳ)
    df: float  # ν
    pooled_run_var: float | None = None  # s², the run-to-run variance of the cell's pool
    pooled_df: float | None = None
    between_run_var: float | None = None  # σ_a²
    within_run_var: float | None = None  # w̄
    within_run_df: float | None = None

    @property
    def poolable(self) -> bool:
        """Whether the card recorded every part the two studies' pooling reads."""
        return all(getattr(self, k) is not None for k in POOL)


@dataclass(frozen=True)
class Device:
    """What a cell's first ok run ran on, which a price applies to."""

    kind: str | None
    name: str | None
    threads_per_worker: int | None = None


@dataclass(frozen=True)
class Side:
    """A cell on one side (BASE, NEW or the STUDY a reference checks): its runs, throughput
    and what the comparison reads beside it."""

    runs: int
    ok: int  # ok runs
    statuses: dict[str, int]  # status -> runs
    n: int  # ok repeats with a throughput
    values: list[float]  # each ok repeat's throughput, samples/s
    mean: float | None
    ci95: float | None  # the half-width of its 95 % interval
    interval: str | None  # its study's interval method (absent in cards made before it)
    model: StepModel | None  # None unless its interval is from steps and repeats
    test_accuracy: float | None
    peak_device_bytes: float | None
    peak_host_rss_bytes: float | None
    notes: list[str] = field(default_factory=list)
    device: Device | None = None  # absent in cards made before it, and with no ok run

    @classmethod
    def of(cls, point: Mapping[str, Any]) -> Side:
        """From a card's point (a missing optional key: what cards made before it mean)."""
        throughput = point["throughput"]
        device = point.get("device")
        return cls(
            runs=point["runs"],
            ok=point["ok"],
            statuses=dict(point["statuses"]),
            n=throughput["n"],
            values=list(throughput["values"]),
            mean=throughput["mean"],
            ci95=throughput["ci95"],
            interval=throughput.get("interval"),
            model=model_of(point),
            test_accuracy=point["test_accuracy"],
            peak_device_bytes=point["peak_device_bytes"],
            peak_host_rss_bytes=point["peak_host_rss_bytes"],
            notes=list(point.get("notes", [])),
            device=Device(**device) if device is not None else None,
        )

    def summary(self) -> dict[str, Any]:
        """The side as compare's JSON gives it beside a cell's ratio."""
        return {"n": self.n, "ok": self.ok, "runs": self.runs, "mean": self.mean,
                "ci95": self.ci95, "interval": self.interval}  # fmt: skip

    def by_status(self) -> str:
        """ "2 failed, 1 oom": its runs by status."""
        return ", ".join(f"{count} {status}" for status, count in sorted(self.statuses.items()))


def model_of(point: Mapping[str, Any]) -> StepModel | None:
    """A card point's model where its study's interval is from steps and repeats; None
    elsewhere (a card made before them; records without batch means)."""
    t = point["throughput"]
    if t.get("interval") != STEPS or any(t.get(k) is None for k in ("log_mean", "log_var", "df")):
        return None
    return StepModel(t["n"], t["log_mean"], t["log_var"], t["df"], *(t.get(k) for k in POOL))

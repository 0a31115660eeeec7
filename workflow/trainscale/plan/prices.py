"""What a device-hour costs (config `cost`), and which price applies to a device.

A study's money figures (`cost_per_million` in scaling.csv, trainscale.analysis.cost) price
each cell's device-hours. The price list is the user's: `cost: {device_hour: {H100: 2.49,
cpu-core: 0.04}, currency: USD}`.

- On CPU the key is `cpu-core`: a worker stands for a device, and its `threads_per_worker`
  threads are priced as that many core-hours.
- On a GPU the device is known from the records (`device.name`, e.g. "NVIDIA H100 80GB
  HBM3"): a key applies when it is a case-insensitive substring of the name, and of the keys
  that apply the longest wins, so `H100 NVL` prices "NVIDIA H100 NVL" and `H100` the rest of
  the H100s. A name that no key matches, or two longest keys of equal length, gets no price,
  and the report names it among its warnings.

Before any job (`check`), a study whose prices cannot apply stops, naming `cost.device_hour`:
a CPU study without `cpu-core`, or a GPU this machine has that no key (or several) matches.
Where the planner sees no GPU (a SLURM login node), GPU names are checked in the report only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainscale.plan.studyconfig import StudyConfig

#: The price key of a CPU core-hour.
CPU_KEY = "cpu-core"


@dataclass(frozen=True)
class Prices:
    """Config `cost`: the price of one device-hour by key, in `currency`."""

    device_hour: Mapping[str, float] = field(default_factory=dict)
    currency: str = "USD"

    @classmethod
    def from_config(cls, config: Mapping | None) -> Prices | None:
        """The prices of a config as a record holds it (a dict), or None where its
        `cost.device_hour` gives none."""
        return cls.from_cost((config or {}).get("cost"))

    @classmethod
    def from_cost(cls, cost: Mapping | None) -> Prices | None:
        """The prices of config `cost`, or None where its `device_hour` gives none."""
        cost = cost or {}
        hourly = {str(k): float(v) for k, v in (cost.get("device_hour") or {}).items()}
        return cls(hourly, str(cost.get("currency") or "USD")) if hourly else None

    def match(self, kind: str | None, name: str | None) -> tuple[str | None, str]:
        """(the key whose price applies to a device of `kind` ("cpu" or "cuda") named `name`:
        the longest that is a part of its name, "") or (None, why none applies)."""
        if kind == "cpu":
            if CPU_KEY in self.device_hour:
                return CPU_KEY, ""
            return None, f"cost.device_hour has no {CPU_KEY!r} price for CPU workers"
        label = name or "an unnamed device"
        keys = [k for k in self.device_hour if k != CPU_KEY and k.lower() in (name or "").lower()]
        if not keys:
            return None, f"no key of cost.device_hour matches the device {label!r}"
        longest = max(map(len, keys))
        keys = [k for k in keys if len(k) == longest]  # "H100 NVL" before "H100"
        if len(keys) == 1:
            return keys[0], ""
        listed = ", ".join(repr(k) for k in sorted(keys))
        return None, f"several keys of cost.device_hour match the device {label!r}: {listed}"


def check(study: StudyConfig, accelerator: str, gpus: list[str]) -> str | None:
    """Why the study's prices cannot apply to what it runs on (None: they can, or none are
    given), with the fix; `gpus` are this machine's GPU names (`gpu_names`)."""
    prices = Prices.from_cost(study.cost)
    rank_by = study.report.get("rank_by") or "throughput"
    if prices is None:
        if rank_by == "cost":
            return (
                "report.rank_by: cost needs prices: give cost.device_hour (e.g. "
                f"{{H100: 2.49, {CPU_KEY}: 0.04}}), or rank by throughput"
            )
        return None
    given = ", ".join(sorted(prices.device_hour))
    if accelerator == "cpu":
        if CPU_KEY in prices.device_hour:
            return None
        return (
            f"cost.device_hour ({given}) has no {CPU_KEY!r} price, and this study runs on CPU "
            f"(accelerator: {study.accelerator}), where each worker's "
            f"threads_per_worker threads are priced as {CPU_KEY} hours: add "
            f"`{CPU_KEY}: <price of one core-hour>` to cost.device_hour, or remove cost"
        )
    problems = [why for key, why in (prices.match("cuda", name) for name in gpus) if key is None]
    if problems:
        return (
            "; ".join(problems)
            + f" (keys: {given}): name each GPU of the study by a key that is a "
            "case-insensitive part of its name (e.g. H100 for 'NVIDIA H100 80GB HBM3'); where "
            "several keys are, the longest prices it"
        )
    return None

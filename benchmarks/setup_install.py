"""How long does `make setup`'s install phase take with uv, against pip, on this machine?

Each install is scripts/install-requirements.sh (what `make setup` runs: a fresh venv, then
requirements.txt's pins and trainscale, editable) into a new virtual environment under a
scratch directory, with TRAINSCALE_INSTALLER=pip or =uv, so both sides install the same pins
with the same pip settings (find-links, constraints, indexes) and both compile bytecode.

- cold: the tool's cache is a new empty directory (PIP_CACHE_DIR / UV_CACHE_DIR): every
  package is downloaded (or read from this machine's local wheels and indexes) and the
  sdists (DeepSpeed) built, as on a new machine;
- warm: each tool's own cache, filled by one untimed install first, is kept between rounds,
  as on a machine that has installed before (CI keeps both caches).

Rounds alternate which tool goes first (pip first in odd rounds), so drift in the network or
the machine's load falls on both. After the first round the two environments' packages are
compared (`pip list --format=freeze`): they must be the same versions, torch the CPU build.
Prints each side's seconds min / median / max and the ratio uv / pip of the medians (the bar:
at most 0.5). Needs the network (PyPI) and several GB of disk per environment; run it alone.

    .venv/bin/python benchmarks/setup_install.py [--rounds 3] [--caches cold,warm]
        [--scratch /tmp] [--requirements requirements.txt]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-requirements.sh"
TOOLS = ("pip", "uv")


def install(tool: str, venv: Path, caches: Path, requirements: str) -> float:
    """One install with `tool` into the new venv `venv`, its cache under `caches`; seconds."""
    env = {
        **os.environ,
        "TRAINSCALE_INSTALLER": tool,
        "PIP_CACHE_DIR": str(caches / "pip"),
        "UV_CACHE_DIR": str(caches / "uv"),
    }
    t0 = time.perf_counter()
    cmd = [str(SCRIPT), str(venv), requirements]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    assert p.returncode == 0, f"{tool} failed:\n{p.stdout[-2000:]}{p.stderr[-3000:]}"
    return seconds


def packages(venv: Path) -> list[str]:
    p = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sorted(line for line in p.stdout.splitlines() if not line.startswith("trainscale"))


def same_environment(a: Path, b: Path) -> None:
    """The pip- and uv-built venvs hold the same package versions, torch the local CPU one."""
    pa, pb = packages(a), packages(b)
    assert pa == pb, f"pip and uv installed different packages: {sorted(set(pa) ^ set(pb))}"
    torch = next((line for line in pa if line.startswith("torch==")), "torch: not installed")
    assert "torch==" not in torch or torch.endswith("+cpu"), f"{torch}: not the CPU build"
    print(f"  same {len(pa)} packages from pip and uv ({torch})", flush=True)


def trio(xs: list[float]) -> str:
    return f"{min(xs):>8.1f} {statistics.median(xs):>8.1f} {max(xs):>8.1f}"


def main() -> None:
    p = argparse.ArgumentParser(
        description=(
            "How long does `make setup`'s install phase take with uv, against pip, on this machine?"
        )
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--caches", default="cold,warm", help="cold, warm or both (comma-separated)")
    p.add_argument("--scratch", default=tempfile.gettempdir(), help="where the venvs go")
    p.add_argument(
        "--requirements", default=str(ROOT / "requirements.txt"),
        help="the pins to install (default: the project's requirements.txt)",
    )  # fmt: skip
    a = p.parse_args()
    kinds = [k for k in a.caches.split(",") if k]
    if not set(kinds) <= {"cold", "warm"}:
        p.error("--caches: cold, warm or cold,warm")
    print(
        f"install phase of `make setup` (scripts/install-requirements.sh), {a.rounds} rounds; "
        f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    seconds: dict[tuple[str, str], list[float]] = {(k, t): [] for k in kinds for t in TOOLS}
    with tempfile.TemporaryDirectory(dir=a.scratch, prefix="setup-install-") as tmp:
        scratch = Path(tmp)
        warm = scratch / "warm-caches"
        if "warm" in kinds:
            for tool in TOOLS:  # fill each tool's cache once (not timed)
                install(tool, scratch / f"prime-{tool}", warm, a.requirements)
                shutil.rmtree(scratch / f"prime-{tool}")
        for i in range(a.rounds):
            order = TOOLS if i % 2 == 0 else TOOLS[::-1]
            for kind in kinds:
                venvs = {}
                for tool in order:
                    venvs[tool] = scratch / f"venv-{kind}-{tool}"
                    caches = warm if kind == "warm" else scratch / f"cold-{tool}-{i}"
                    s = install(tool, venvs[tool], caches, a.requirements)
                    seconds[(kind, tool)].append(s)
                    if kind == "cold":
                        shutil.rmtree(caches, ignore_errors=True)
                    print(
                        f"round {i + 1} {kind:<4} {tool:<3} {s:>7.1f} s "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
                if i == 0:
                    same_environment(venvs["pip"], venvs["uv"])
                for venv in venvs.values():
                    shutil.rmtree(venv)
    print(f"\n{'caches':<6} {'tool':<4} {'min':>8} {'median':>8} {'max':>8}   (seconds)")
    for kind in kinds:
        for tool in TOOLS:
            print(f"{kind:<6} {tool:<4} {trio(seconds[(kind, tool)])}")
        ratio = statistics.median(seconds[(kind, "uv")]) / statistics.median(seconds[(kind, "pip")])
        verdict = "meets" if ratio <= 0.5 else "misses"
        print(f"{kind:<6} uv / pip (medians) {ratio:.2f}: {verdict} the bar of at most 0.5")
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""`trainscale tune STUDY [SNAKEMAKE ARGS...]`: the fastest (or cheapest) cells of a study's
matrix without running the whole grid: `snakemake tune --configfile STUDY`, with any further
arguments passed on (`--profile slurm` tunes on a cluster's queue, `-n` shows round 1's jobs).
Run it where you run snakemake; the results are under results/<study>/tune/ (docs/tune.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

#: The workflow's Snakefile, given to Snakemake where the directory it runs in has none.
SNAKEFILE = Path(__file__).resolve().parents[3] / "Snakefile"
#: `trainscale tune --help`'s description.
DESCRIPTION = (
    "the fastest (or cheapest) cells of a study's matrix without running the whole grid: "
    "`snakemake tune --configfile STUDY`, with any further arguments passed on (`--profile "
    "slurm` tunes on a cluster's queue, `-n` shows round 1's jobs). Run it where you run "
    "snakemake; the results are under results/<study>/tune/ (docs/tune.md)."
)


def command(study: str, rest: list[str], here: Path | None = None) -> list[str]:
    """The snakemake command line of `trainscale tune STUDY REST...` run in `here`."""
    cmd = [sys.executable, "-m", "snakemake", "tune", "--configfile", study, *rest]
    here = Path.cwd() if here is None else here
    given = any(a in ("-s", "--snakefile") or a.startswith("--snakefile=") for a in rest)
    if not given and not (here / "Snakefile").is_file() and SNAKEFILE.is_file():
        cmd[4:4] = ["--snakefile", str(SNAKEFILE)]
    return cmd


def main(argv: list[str] | None = None, prog: str = "trainscale tune") -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog="The study's `tune:` keys set the objective, eta and the budget "
        "(docs/config.md); anything after STUDY goes to snakemake as it is.",
    )
    p.add_argument("study", metavar="STUDY", help="a study config file (as --configfile takes)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args, rest = p.parse_args(argv[:1]), argv[1:]  # STUDY first; the rest is snakemake's
    if not Path(args.study).is_file():
        p.error(f"{args.study}: no such study file")
    cmd = command(args.study, rest)
    print("trainscale tune: " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=False).returncode

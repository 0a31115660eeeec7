"""`trainscale`: the one command for users (`python -m trainscale` is the same).

    trainscale check CONFIG...        check a study file before any job runs
    trainscale fit CONFIG             the largest batch size that fits, per cell
    trainscale tune CONFIG            the fastest cells without the whole grid
    trainscale report --runs-dir D --out O
    trainscale compare BASE NEW       exit 1 on a regression
    ...                               `trainscale --help` lists them all

Each subcommand's options are parsed by the module that does the work (its `main(argv,
prog)`), imported only when that subcommand runs, so `trainscale --help` starts fast and the
old `python -m trainscale.report`, `.compare` and `.matrix` take exactly the same options.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

import trainscale


class Command(NamedTuple):
    module: str  # its `main(argv, prog) -> int` (or `function`) does the work
    help: str
    function: str = "main"


COMMANDS: dict[str, Command] = {
    "check": Command("trainscale.plan.check", "check study config files; run nothing"),
    "fit": Command(
        "trainscale.plan.check",
        "the largest batch size that fits each cell's memory limit",
        "fit_main",
    ),
    "tune": Command(
        "trainscale.tune.cli", "the fastest or cheapest cells without the whole grid (snakemake)"
    ),
    "report": Command(
        "trainscale.report.cli", "tables, figures and report.html from metrics files"
    ),
    "compare": Command(
        "trainscale.compare.cli", "compare two studies or scaling cards, or check references"
    ),
    "card": Command("trainscale.compare.card", "write the scaling card of a folder of runs"),
    "collectives": Command(
        "trainscale.runners.collectives", "the all-reduce benchmark, by message size"
    ),
    "export-data": Command(
        "trainscale.data.export_data",
        "a built-in data set in the formats users bring",
    ),
    "gpu-check": Command("trainscale.gpu.check", "every GPU path on this node, one line each"),
    "doctor": Command(
        "trainscale.gpu.doctor", "is each node fit to run a study: one PASS/FAIL line a node"
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainscale",
        description="Measure which distributed-training strategy trains your model fastest. "
        "Studies run with snakemake; these commands check, report and compare them.",
        epilog="`trainscale COMMAND --help` lists a command's options.",
    )
    p.add_argument("--version", action="version", version=f"trainscale {trainscale.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, cmd in COMMANDS.items():
        # the command's own parser reads everything after its name, --help included
        sub.add_parser(name, help=cmd.help, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    args, rest = p.parse_known_args(argv)
    if args.command is None:
        if rest:
            p.error(f"unrecognized arguments: {' '.join(rest)}; give a COMMAND first")
        p.print_help()
        return 0
    command = COMMANDS[args.command]
    run = getattr(importlib.import_module(command.module), command.function)
    return run(rest, prog=f"trainscale {args.command}")


if __name__ == "__main__":
    sys.exit(main())

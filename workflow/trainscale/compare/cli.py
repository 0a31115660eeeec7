"""`trainscale compare BASE NEW` and `trainscale compare --reference FILE STUDY`: a regression
check CI can run (`python -m trainscale.compare` too): the verdicts are in `verdicts`,
the reference check in `references`, how both are shown in `output`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainscale.compare import output as compare_output
from trainscale.compare import references, verdicts

#: `trainscale compare --help`'s description; docs/compare.md defines every figure.
DESCRIPTION = """\
Compare two studies (or two clusters' scaling cards): a regression check CI can run.

    trainscale compare BASE NEW [--threshold 0.05] [--html FILE] [--json FILE]
    trainscale compare --reference references.yaml STUDY

BASE and NEW are each a study's results folder, any folder of metrics.json files gathered from
elsewhere, or a scaling-card.json; every folder is first turned into its scaling card, so
studies and cards are compared alike. Every figure is defined in docs/compare.md."""


def main(argv: list[str] | None = None, prog: str = "trainscale compare") -> int:
    """`trainscale compare` (and `python -m trainscale.compare`): exit 1 on a regression."""
    p = argparse.ArgumentParser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=DESCRIPTION,
        epilog="Exit status: 1 when any cell is slower (with --cost: or dearer) beyond both its "
        "95%% CI and the threshold (with --reference: outside its tolerance), 0 otherwise, 2 on "
        "bad input.",
    )
    p.add_argument("folders", nargs="+", metavar="BASE NEW", help="two studies or cards")
    p.add_argument("--threshold", type=float, default=0.05, help="default: %(default)s (5%%)")
    p.add_argument(
        "--ci",
        choices=list(verdicts.METHODS),
        default="steps",
        help="how the ratio's 95%% CI is made (default: %(default)s: the model of steps and "
        "repeats, both studies' run-to-run spread pooled where alike; the bootstrap where a "
        "side lacks step times)",
    )
    p.add_argument(
        "--cost",
        type=Path,
        metavar="FILE",
        help="a YAML file with a `cost:` section (a study config): compare cost per million "
        "too; a dearer cell fails like a slower one",
    )
    p.add_argument("--reference", type=Path, help="references.yaml: check ONE study against it")
    p.add_argument("--html", type=Path, help="also write a self-contained HTML page here")
    p.add_argument("--json", type=Path, help="also write the comparison as JSON here")
    a = p.parse_args(argv)
    want = 1 if a.reference else 2
    if len(a.folders) != want:
        p.error("give exactly one study with --reference" if a.reference else "give BASE and NEW")
    if not 0 <= a.threshold < 1:
        p.error(f"--threshold {a.threshold}: give a fraction in [0, 1), e.g. 0.05 for 5%")
    try:
        if a.reference:
            result = references.check(verdicts.load(a.folders[0], "STUDY"), a.reference)
        else:
            prices = verdicts.prices_from(a.cost) if a.cost else None
            result = verdicts.compare_paths(
                *a.folders, threshold=a.threshold, method=a.ci, prices=prices
            )
    except (verdicts.CompareError, references.ReferenceFileError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(compare_output.text(result), end="")
    if a.json:
        compare_output.write_json(result, a.json)
    if a.html:
        compare_output.write_html(result, a.html)
    return result.exit_status

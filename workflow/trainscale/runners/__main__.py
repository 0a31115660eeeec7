"""Worker entry point: `python -m trainscale.runners --spec JSON --out metrics.json`.

Started once per rank by the strategy's launcher (see trainscale.launch); rank 0 writes.
"""

import argparse
import importlib

from trainscale.plan.matrix import RunSpec
from trainscale.runners import RUNNER_MODULES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    spec = RunSpec.from_json(a.spec)
    runner = importlib.import_module(f"trainscale.runners.{RUNNER_MODULES[spec.strategy]}")
    runner.main(spec, a.out)


if __name__ == "__main__":
    main()

"""`python -m trainscale.report`: the same as `trainscale report`."""

import sys

from trainscale.report.cli import main

sys.exit(main(prog="python -m trainscale.report"))

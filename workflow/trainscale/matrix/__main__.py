"""`python -m trainscale.matrix CONFIG...`: the same as `trainscale check CONFIG...`."""

import sys

from trainscale.plan.check import main

sys.exit(main(prog="python -m trainscale.matrix"))

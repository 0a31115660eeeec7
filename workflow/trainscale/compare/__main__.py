"""`python -m trainscale.compare`: the same as `trainscale compare`."""

import sys

from trainscale.compare.cli import main

sys.exit(main(prog="python -m trainscale.compare"))

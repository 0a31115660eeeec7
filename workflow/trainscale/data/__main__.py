"""`python -m trainscale.data download|check NAME DATA_DIR` (the `download` rule)."""

import sys

from trainscale.data import main

sys.exit(main())

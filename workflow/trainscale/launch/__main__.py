"""`python -m trainscale.launch --spec JSON --out metrics.json`: the supervisor the `train` rule
calls (trainscale.launch.supervise)."""

import sys

from trainscale.launch.supervise import main

sys.exit(main())

"""Snakemake script: round 0 of a tune (trainscale.tune.space), the cells it tries and the
combinations it drops, as the rounds read it."""

import contextlib
import json
from pathlib import Path

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    space = snakemake.params.space
    Path(snakemake.output[0]).write_text(json.dumps(space, indent=1) + "\n")
    print(
        f"tune of {space['study']!r}: {len(space['cells'])} cells tried, "
        f"{len(space['dropped'])} combinations dropped",
        file=log,
    )

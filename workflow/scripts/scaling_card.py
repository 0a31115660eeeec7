"""Snakemake script: results/<study>/scaling-card.json from the study's metrics files and its
all-reduce benchmark (trainscale.card), validated against its schema."""

import sys
from pathlib import Path

from trainscale import card

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    built = card.from_files(
        list(snakemake.input.metrics),  # noqa: F821
        list(snakemake.input.collectives),  # noqa: F821
        str(Path(snakemake.output.card).parent),  # noqa: F821 (results/<study>)
        snakemake.config["study"],  # noqa: F821
    )
    card.write(built, snakemake.output.card)  # noqa: F821
    print(f"trainscale.card: wrote {snakemake.output.card}", file=log)  # noqa: F821

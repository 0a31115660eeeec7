"""Snakemake script: collectives.csv (all-reduce bandwidth by message size) and
communication.csv (the communication model of every DDP-family cell)."""

import sys

from trainscale import aggregate

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    coll = aggregate.collectives_frame(snakemake.input.collectives)  # noqa: F821
    study = aggregate.read_study(
        snakemake.input.runs,  # noqa: F821
        scaling_csv=snakemake.input.scaling,  # noqa: F821
        name=snakemake.config["study"],  # noqa: F821
    )
    comm = aggregate.communication_frame(study.scaling, study.runs, coll)
    coll.to_csv(snakemake.output.collectives, index=False)  # noqa: F821
    comm.to_csv(snakemake.output.communication, index=False)  # noqa: F821
    print(f"trainscale: {len(coll)} message sizes, {len(comm)} DDP-family cells", file=log)

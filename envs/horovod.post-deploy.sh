#!/usr/bin/env bash
# Snakemake runs this once, inside the freshly created envs/horovod.yaml env: build and install
# Horovod with the project's script (see its header). The script is found through the trainscale
# package, which the workflow puts on PYTHONPATH (trainscale.launch.commands.job_environment).
set -euo pipefail
root=$(python -c 'import pathlib, trainscale; print(pathlib.Path(trainscale.__file__).parents[2])')
bash "$root/scripts/build-horovod.sh" python

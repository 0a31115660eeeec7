"""Plan: what a study runs, fixed before any job. No framework is imported here.

Read top to bottom (a layers contract in pyproject.toml keeps it so):

- `check`: the config's problems, `trainscale check` and `trainscale fit`;
- `fit`: the cells over config `memory:`'s limits dropped with the reason and the advice, and
  the largest batch that fits;
- `matrix`: a config expanded into frozen run specs, with its rules in `speed_options`,
  `knobs`, `faults`, `datafit`, `exclusions`, `cluster` (container, env, SLURM keys),
  `prices`, `overlay` (a study file laid over config.yaml), `deepspeed_config`, and
  `preflight/` (what asks a child process before any job: own and `hf:` models, the memory
  estimate);
- `machine`: the GPUs of the host that plans, and what `accelerator: auto` means there;
- `runspec`: the frozen run spec;
- `catalog/`: one row of facts per strategy and per model, and their rules.

May import: data (to check the data sets a study names).
"""

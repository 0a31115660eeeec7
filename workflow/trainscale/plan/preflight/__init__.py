"""Pre-flight: what the planner asks a child process before any job, and the answers.

The Snakefile's process imports neither torch nor the user's code; what needs them runs in a
child (`child`: the protocol, a request file in, an answer file out, the child's own output to
a log), and each answer is cached by everything that decides it:

- `own_models`: the user's own models (config `models:`) built on the meta device, the facts
  the matrix needs read back (blocks, BatchNorm, parameters);
- `hf_models`: Hugging Face configs (`hf:NAME`) read and checked, expanded into own models;
- `memory`: every run's memory per rank predicted by a traced step (`memory_key`: the cache
  key; `memory_parts`: the arithmetic of host memory, DeepSpeed's states and the SLURM
  request, which needs no child).

The matrix reads these answers; what re-plans cells with them (the drops over the limits, the
advice, `trainscale fit`) is trainscale.plan.fit, above the matrix.
"""

"""The memory trace: one training step of a run traced on fake tensors, in a child process of
the planner, for the peak memory per rank predicted before any job (`trace`; the model, batch,
steps and optimizer it traces: `steps`)."""

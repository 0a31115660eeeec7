"""Measure: what a run records. The metrics record and its schema helpers, memory, device
and CPU usage, NVML, data wait, per-class scores, and the all-reduce benchmark's definitions.
May import: models, plan, data.
"""

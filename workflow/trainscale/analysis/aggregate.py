"""Study tables from metrics files: one row per run, one per cell, and the answers drawn from them.

The package's face for the tables: it gathers what `metrics_tables` (reading and validating the
files), `cells` and `comm_model` (the per-cell figures) and `ranking` and `summary` (the answers)
compute. docs/methods.md defines every figure; the report shows it as its Methods.
"""

from trainscale.analysis.cells import (
    BASELINE,
    CELL,
    METRICS,
    SINGLE,
    ci95,
    convergence_frame,
    scaling_frame,
    t975,
    with_axes,
)
from trainscale.analysis.comm_model import (
    COLLECTIVE_COLUMNS,
    COMM_COLUMNS,
    COMM_VOLUME,
    busbw_at,
    collectives_frame,
    communication_frame,
    failed_collectives,
    gradient_bytes,
    measured_collectives,
)
from trainscale.analysis.metrics_tables import (
    EPOCH_FIELDS,
    LEAD,
    default_jobs,
    epochs_frame,
    find_metrics,
    load,
    mp_context,
    read_tables,
    run_id,
    runs_frame,
)
from trainscale.analysis.ranking import fastest, rate
from trainscale.analysis.study import Study, study_name
from trainscale.analysis.summary import human, summary_text

__all__ = [
    "BASELINE",
    "CELL",
    "COLLECTIVE_COLUMNS",
    "COMM_COLUMNS",
    "COMM_VOLUME",
    "EPOCH_FIELDS",
    "LEAD",
    "METRICS",
    "SINGLE",
    "Study",
    "busbw_at",
    "ci95",
    "collectives_frame",
    "communication_frame",
    "convergence_frame",
    "default_jobs",
    "epochs_frame",
    "failed_collectives",
    "fastest",
    "find_metrics",
    "gradient_bytes",
    "human",
    "load",
    "measured_collectives",
    "mp_context",
    "read_tables",
    "run_id",
    "runs_frame",
    "scaling_frame",
    "study_name",
    "summary_text",
    "t975",
    "with_axes",
    "rate",
]

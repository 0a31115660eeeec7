"""Training loops, one readable file per framework; `python -m trainscale.runners` is the worker.

Every runner gets the same data (`trainscale.data`), the same model (`trainscale.models`), the
same hyper-parameters (the run spec) and records through the same `metrics.Recorder`.
"""

from trainscale import catalog

#: strategy -> module in this package whose `main(spec, out)` trains it (the catalog's `runner`)
RUNNER_MODULES: dict[str, str] = {s.name: s.runner for s in catalog.STRATEGIES.values() if s.runner}

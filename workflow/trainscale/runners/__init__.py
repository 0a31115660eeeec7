"""Runners: one training loop per framework, strategies as small plug-ins on it: `torch/`
(PyTorch), `tensorflow/` (Keras); `python -m trainscale.runners` is the worker every launcher
starts, `collectives` the all-reduce benchmark. May import: launch, measure, models, plan, data.
"""

# Every runner gets the same data (`trainscale.data`), the same model (`trainscale.models`), the
# same hyper-parameters (the run spec) and records through the same `metrics.Recorder`.

from trainscale.plan import catalog

#: strategy -> module under this package whose `main(spec, out)` trains it: the catalog's
#: `runner`, in the folder of the strategy's runtime (torch/ or tensorflow/)
RUNNER_MODULES: dict[str, str] = {
    s.name: f"{s.runtime}.{s.runner}" for s in catalog.STRATEGIES.values() if s.runner
}

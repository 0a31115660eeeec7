"""Training loops, one readable file per framework; `python -m trainscale.runners` is the worker.

Every runner gets the same data (`trainscale.data`), the same model (`trainscale.models`), the
same hyper-parameters (the run spec) and records through the same `metrics.Recorder`.
"""

#: strategy -> module in this package whose `run(spec, out)` trains it
RUNNER_MODULES: dict[str, str] = {
    "torch": "pytorch",
    "torch-dp": "pytorch",
    "torch-ddp": "pytorch",
}

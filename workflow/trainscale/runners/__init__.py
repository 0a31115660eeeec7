"""Training loops, one readable file per framework; `python -m trainscale.runners` is the worker.

Every runner gets the same data (`trainscale.data`), the same model (`trainscale.models`), the
same hyper-parameters (the run spec) and records through the same `metrics.Recorder`.
"""

#: strategy -> module in this package whose `run(spec, out)` trains it
RUNNER_MODULES: dict[str, str] = {
    "torch": "pytorch",
    "torch-dp": "pytorch",
    "torch-ddp": "pytorch",
    "torch-fsdp": "pytorch",
    "torch-pipeline": "pipeline",
    "tf": "tf",
    "tf-mirrored": "tf",
    "tf-multiworker": "tf",
    "deepspeed-zero0": "deepspeed_zero",
    "deepspeed-zero1": "deepspeed_zero",
    "deepspeed-zero2": "deepspeed_zero",
    "deepspeed-zero3": "deepspeed_zero",
    "horovod-torch": "horovod_torch",
    "horovod-torch-elastic": "horovod_torch",
    "horovod-keras": "horovod_keras",
    "lightning-ddp": "lightning_ddp",
}

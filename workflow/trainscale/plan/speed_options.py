"""The PyTorch speed options of a study and where they apply: `memory_format` (channels_last:
image batches and convolution weights laid out NHWC), `compile` (`torch.compile` of the model)
and `grad_accum` (each optimizer step accumulates the gradients of that many micro-batches of
the per-worker batch). Each is a matrix axis (`matrix.memory_format`, `matrix.compile`,
`matrix.grad_accum`) whose default (contiguous, false, 1) stays out of a run's path, so one
study compares DDP with channels_last beside FSDP without; the top-level keys of the same name
give the axis its one value where the matrix names none.

A cell whose strategy or model cannot take an option is dropped by the matrix with the reason
given here, as the catalog's constraints drop theirs. Imports no framework.
"""

from __future__ import annotations

from trainscale.plan import catalog
from trainscale.plan.studyconfig import StudyConfig

MEMORY_FORMATS: tuple[str, ...] = ("contiguous", "channels_last")

_FSDP = 'FSDP2 shards only contiguous parameters (fully_shard: "FSDP does not support '
_FSDP += 'non-contiguous parameters yet")'
_PIPELINE = "torch.distributed.pipelining sends each stage's activations as they are laid out, "
_PIPELINE += 'and process-group sends take contiguous tensors only (gloo: "input tensor has to '
_PIPELINE += 'be contiguous")'
_DEEPSPEED = "DeepSpeed's engine broadcasts every parameter as a byte view, which a channels_last "
_DEEPSPEED += 'weight cannot give ("self.stride(-1) must be 1 to view Float as Byte")'
_HOROVOD = "Horovod's broadcast_parameters fails on channels_last weights (it takes contiguous "
_HOROVOD += "tensors only)"

#: strategy -> why `memory_format: channels_last` cannot run it (found by running each here,
#: PyTorch 2.13, DeepSpeed 0.19, Horovod 0.28; besides every TensorFlow-runtime strategy)
NO_CHANNELS_LAST: dict[str, str] = {
    "torch-fsdp": _FSDP,
    "torch-fsdp-tp": _FSDP,
    "torch-pipeline": _PIPELINE,
    **dict.fromkeys(catalog.names(framework="deepspeed"), _DEEPSPEED),
    **dict.fromkeys(catalog.names(runner="horovod_torch"), _HOROVOD),
}

#: strategy -> why `compile: true` cannot run it (besides every TensorFlow-runtime strategy)
NO_COMPILE: dict[str, str] = {
    "torch-dp": "nn.DataParallel runs its replicas' forwards in threads, which torch.compile "
    "does not trace (it falls back to eager on several devices, pytorch#94636); use torch-ddp",
}


#: the speed options' matrix axes -> their defaults (the top-level keys override them)
DEFAULTS: dict[str, object] = {"memory_format": "contiguous", "compile": False, "grad_accum": 1}


def axes(study: StudyConfig) -> dict[str, list]:
    """The speed options' matrix axes where `matrix` names none: the study-wide top-level key's
    one value (memory_format, compile, grad_accum; the schema's default where not given)."""
    return {k: [getattr(study, k)] for k in DEFAULTS}


def why_not(
    strategy: str,
    model: str,
    memory_format: str,
    compile: bool,
    own: object | None = None,
    grad_accum: int = 1,
) -> str | None:
    """The reason `strategy` on `model` (`own`: the user's model, plan.own_models.OwnModel)
    cannot run with these options, or None if it can."""
    s = catalog.STRATEGIES[strategy]
    images = own.input == "image" if own is not None else None
    if memory_format == "channels_last":
        if s.runtime != "torch":
            return (
                f"{strategy}: memory_format channels_last is a PyTorch layout; Keras lays image "
                "batches out channels-last (NHWC) already"
            )
        if strategy in NO_CHANNELS_LAST:
            return f"{strategy}: memory_format channels_last: {NO_CHANNELS_LAST[strategy]}"
        if images is False or (own is None and len(catalog.MODELS[model].published_input) != 3):
            return f"memory_format channels_last: {model} takes no (C, H, W) image input"
    if compile:
        if s.runtime != "torch":
            return (
                f"{strategy}: compile is torch.compile, a PyTorch option; Keras traces its "
                "train step into a tf.function graph already"
            )
        if strategy in NO_COMPILE:
            return f"{strategy}: compile: {NO_COMPILE[strategy]}"
    if grad_accum > 1 and s.runtime != "torch":
        return (
            f"{strategy}: grad_accum {grad_accum}: the Keras strategies step the optimizer "
            "once per batch (no gradient accumulation is wired in)"
        )
    return None

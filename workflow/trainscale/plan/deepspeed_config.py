"""The ds_config of a DeepSpeed run (`deepspeed-zero0` … `3`): a pure function of its run spec
and the user's fragment (config `deepspeed_config`), so the planner reads the same
configuration the runner hands to `deepspeed.initialize` (its memory prediction counts the
model states and buckets this configuration sizes; trainscale.plan.preflight.memory_parts)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from trainscale.plan.runspec import RunSpec

#: ds_config keys the study owns: a user fragment may not override them.
STUDY_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "optimizer",
    "scheduler",
)


def stage(spec: RunSpec) -> int:
    return int(spec.strategy.removeprefix("deepspeed-zero"))


def merge(base: dict, over: dict) -> dict:
    """Recursive dict merge: `over` wins, nested mappings are merged key by key."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_fragment(path: str | None) -> dict:
    """The user's ds_config fragment (JSON or YAML); refuses keys the study owns."""
    if not path:
        return {}
    text = Path(path).read_text()
    frag = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    if not isinstance(frag, dict):
        raise ValueError(f"deepspeed_config {path}: expected a mapping, got {type(frag).__name__}")
    clash = [k for k in STUDY_KEYS if k in frag]
    if clash:
        raise ValueError(
            f"deepspeed_config {path} sets {', '.join(clash)}: batch sizes and the optimizer "
            "come from the study (matrix.batch_size, grad_accum, optimizer) so every strategy "
            "trains alike; remove them from the fragment"
        )
    return frag


def offloaded(spec: RunSpec) -> dict:
    """ZeRO's offload entries for the run's `offload` (plan.knobs): the optimizer's state and
    step on the host, and for `params` (ZeRO-3) the parameters too."""
    out = {}
    if spec.offload in ("optimizer", "params"):
        out["offload_optimizer"] = {"device": "cpu"}
    if spec.offload == "params":
        out["offload_param"] = {"device": "cpu"}
    return out


def ds_config(spec: RunSpec, fragment: dict | None = None) -> dict:
    """The ds_config for a run: batch sizes, ZeRO stage and precision from the spec."""
    cfg = {
        "train_batch_size": spec.global_batch_size,
        "train_micro_batch_size_per_gpu": spec.per_worker_batch_size // spec.grad_accum,
        "gradient_accumulation_steps": spec.grad_accum,
        "zero_optimization": {"stage": stage(spec), **offloaded(spec)},
        # torch.optim.SGD is not on ZeRO's tested list; the update rule is the study's
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "bf16": {"enabled": spec.precision == "bf16"},
        "fp16": {
            "enabled": spec.precision == "fp16",
            "loss_scale": 0,  # dynamic loss scaling
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        # DeepSpeed times forward/backward/step itself (host timers on CPU, events on GPU) and
        # logs one line per step; the runner averages them over the steady epochs.
        "wall_clock_breakdown": True,
        "steps_per_print": 2**31 - 1,
    }
    return merge(cfg, fragment or {})

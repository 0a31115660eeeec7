"""A run specification: everything one training run needs, fixed before it starts.

`RunSpec` is the single source of a run's output path (`RunSpec.path`), of the launcher's
argument (`RunSpec.to_json`) and of the metrics' `spec` (`RunSpec.to_dict`): nothing downstream
derives these again. `trainscale.plan.matrix` builds them from the config; the launcher, the runners
and the aggregation read them. Imports neither torch nor TensorFlow.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from trainscale.data import imagesets, tokens
from trainscale.plan import catalog

#: Matrix keys in path order. `repeat` follows them in the path; the later axes are in it
#: only away from their default (`OUT_OF_PATH`), so every run that does not use one keeps
#: the path it had before the axis existed.
MATRIX_KEYS: tuple[str, ...] = (
    "strategy",
    "model",
    "dataset",
    "seq_len",
    "scale",
    "batch_size",
    "batch_mode",
    "workers",
    "nodes",
    "tp",
    "precision",
    "activation_checkpointing",
    "offload",
    "memory_format",
    "compile",
    "grad_accum",
)

#: later axes -> the value that leaves them out of a run's path: seq_len 0 (image data), tp 1
#: (no tensor parallelism), no activation checkpointing, no offload, and the speed options'
#: defaults (contiguous layout, eager, one micro-batch per step: plan.speed_options)
OUT_OF_PATH: dict[str, object] = {
    "seq_len": 0,
    "tp": 1,
    "activation_checkpointing": "none",
    "offload": "none",
    "memory_format": "contiguous",
    "compile": False,
    "grad_accum": 1,
}

#: A spec's JSON: sorted keys, no spaces. One encoder, made once: json.dumps with options
#: builds a new one per call, and a dry-run writes one spec per run.
_SPEC_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


class ConfigError(ValueError):
    """A config that cannot become a run set; the message names the key and the fix."""


#: the learning rate a `diverge` fault (config `faults`) gives the runs it matches, from their
#: first step: their loss explodes at once in every framework (fp32 Adam reaches ~1e21, SGD
#: nan), so a study can show a diverged run beside healthy ones
DIVERGE_LR = 1e6


@dataclass(frozen=True)
class OwnModel:
    """One entry of `models:` as a run needs it (paths absolute), with the facts the pre-flight
    check found: `block_count` (len of `blocks`, 0 without), `batchnorm` and `params` (at the
    run's data set)."""

    name: str
    torch: str
    keras: str | None
    kwargs: str  # the builders' keyword arguments as JSON text (sorted keys): frozen, hashable
    input: str
    blocks: str | None
    tp_plan: str | None
    code: tuple[str, ...]
    block_count: int = 0
    batchnorm: bool = False
    params: int = 0
    init: str | None = None  # "module:callable": built on meta, initialised module by module
    embedding: str | None = None  # module path of the token embedding (split by vocabulary)
    head: str | None = None  # module path of the LM head (its logits split by vocabulary)

    @property
    def builder_kwargs(self) -> dict:
        return json.loads(self.kwargs)

    @classmethod
    def from_dict(cls, d: dict) -> OwnModel:
        return cls(**{**d, "code": tuple(d.get("code", ()))})

    def row(self) -> catalog.Model:
        """The catalog row the matrix's constraints read (blocks that run the model end to end
        bound the pipeline stages; any named blocks carry a tensor-parallel plan)."""
        return catalog.Model(self.name, self.block_count, 1, self.batchnorm, self.params, (), 0,
                     self.input, tp_plan=self.tp_plan is not None,
                     named_blocks=self.blocks is not None)  # fmt: skip


@dataclass(frozen=True)
class Fault:
    """A fault injected on purpose (config `faults`): `kind` on rank `rank` in epoch `epoch`;
    with `part`, an exception in that measurement after training (runners.guarded.PARTS) on
    every rank instead."""

    kind: str
    rank: int = 0
    epoch: int = 1
    part: str | None = None


@dataclass(frozen=True)
class RunSpec:
    """Everything one training run needs, fixed before it starts."""

    study: str
    strategy: str
    model: str
    dataset: str
    scale: int
    batch_size: int
    batch_mode: str
    workers: int
    nodes: int
    precision: str
    repeat: int
    seed: int
    epochs: int
    optimizer: str
    lr: float
    base_lr: float
    lr_scaling: str
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    momentum: float
    global_batch_size: int
    per_worker_batch_size: int
    world_size: int
    threads_per_worker: int
    timeout_minutes: float
    target_accuracy: float | None
    data_dir: str
    grad_accum: int = 1
    deepspeed_config: str | None = None
    fault: Fault | None = None
    horovod_timeline: bool = False
    pipeline_schedule: str | None = None
    microbatches: int = 1
    steps_per_epoch: int | None = None
    eval_tokens: int = tokens.EVAL_TOKENS  # config eval_tokens: test tokens one evaluation scores
    samples: int | None = None
    image_size: tuple[int, int] | None = None
    image_source: imagesets.ImageSource | None = None
    loader_workers: int = 0
    ps_tasks: int = 0  # tf-ps: parameter servers (config ps_tasks); 0 for other strategies
    memory_format: str = "contiguous"  # config memory_format (trainscale.plan.speed_options)
    compile: bool = False  # config compile: torch.compile the model
    seq_len: int = 0  # tokens per window (matrix seq_len); 0 for image data
    token_source: tokens.TokenSource | None = None  # the user's token files (`datasets:`)
    own_model: OwnModel | None = None  # the user's own model (`models:`), its facts checked
    tp: int = 1  # tensor-parallel degree (matrix tp): ranks each layer is split over
    activation_checkpointing: str = "none"  # none | full | selective (plan.knobs)
    offload: str = "none"  # none | optimizer | params (plan.knobs)
    fused: bool | str = "auto"  # config optimizer.fused: auto | true | false (PyTorch family)
    evaluate: bool = True  # score the test set (False: `trainscale tune`'s runs time steps only)
    #: the device every rank must train on: "cuda" (a rank without a usable GPU fails the run,
    #: never falls back to the CPU: trainscale.runners.device_check) or "cpu"
    accelerator: str = "cpu"

    @property
    def processes(self) -> int:
        """Processes the run starts, each with threads_per_worker threads: one per worker,
        and for tf-ps its parameter servers and its coordinator (chief) besides."""
        return self.world_size + (self.ps_tasks + 1 if self.ps_tasks else 0)

    @property
    def data_replicas(self) -> int:
        """Data-parallel replicas: ranks that each feed their own batch (catalog.data_replicas)."""
        return catalog.data_replicas(self.strategy, self.world_size, self.tp)

    @property
    def framework(self) -> str:
        return catalog.STRATEGIES[self.strategy].framework

    @property
    def path(self) -> str:
        """Run id and output sub-path: `key~value` segments, as Snakemake's Paramspace writes."""
        parts = [
            f"{k}~{getattr(self, k)}"
            for k in MATRIX_KEYS
            if k not in OUT_OF_PATH or getattr(self, k) != OUT_OF_PATH[k]
        ]
        return "/".join([*parts, f"repeat~{self.repeat}"])

    @property
    def cell(self) -> tuple:
        """Every matrix value but the repeat: the unit that scaling tables group by."""
        return tuple(getattr(self, k) for k in MATRIX_KEYS)

    def to_dict(self) -> dict:
        # field by field, not dataclasses.asdict: asdict deep-copies every value, and a dry-run
        # serialises one spec per run (8,000 in a large study)
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["betas"] = list(self.betas)
        for nested in ("fault", "image_source", "token_source", "own_model"):
            if d[nested] is not None:
                d[nested] = asdict(d[nested])
        return d

    def to_json(self) -> str:
        return _SPEC_JSON.encode(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        names = {f.name for f in fields(cls)}
        missing = {f.name for f in fields(cls) if f.default is MISSING} - set(d)
        if missing:
            raise ValueError(f"run spec lacks {sorted(missing)}")
        kw = {k: d[k] for k in names if k in d}
        kw["betas"] = tuple(kw["betas"])
        if kw.get("fault"):
            kw["fault"] = Fault(**kw["fault"])
        if kw.get("image_size"):
            kw["image_size"] = tuple(kw["image_size"])
        if kw.get("image_source"):
            kw["image_source"] = imagesets.ImageSource.from_dict(kw["image_source"])
        if kw.get("token_source"):
            kw["token_source"] = tokens.TokenSource.from_dict(kw["token_source"])
        if kw.get("own_model"):
            kw["own_model"] = OwnModel.from_dict(kw["own_model"])
        return cls(**kw)

    @classmethod
    def from_json(cls, s: str) -> RunSpec:
        return cls.from_dict(json.loads(s))


#: One combination of the matrix's values: {matrix key (MATRIX_KEYS): its value}.
CellValues = dict[str, Any]


@dataclass(frozen=True)
class Dropped:
    """A matrix combination that will not run, and why."""

    values: CellValues
    reason: str

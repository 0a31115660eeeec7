"""The strategy rows: one `Strategy` of facts per distributed-training strategy (how it runs,
launches, communicates and is drawn), and `why_not`, the rule that says which cells a strategy
cannot run. Adding a strategy is one row here plus its runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainscale.plan.catalog.cell import Cell
from trainscale.plan.catalog.rules import (
    PIPELINE_PRECISIONS,
    PS_PRECISIONS,
    arrays_only,
    lightning_data,
    lightning_fp16,
    pipeline_microbatches,
    pipeline_precision,
    pipeline_schedule,
    pipeline_stages,
    ps_precision,
    ps_tokens,
)
from trainscale.plan.catalog.tp import (
    tp_degree,
    tp_model,
    tp_precision,
    tp_strategies,
)

#: A constraint: the reason a user reads when `cell` cannot run, or None when it can.
Constraint = Callable[[Cell], "str | None"]  # (rules.Constraint, with Cell resolved)


@dataclass(frozen=True)
class Strategy:
    """One distributed-training strategy: how it runs, launches, communicates and is drawn."""

    name: str
    framework: str  # torch | tensorflow | horovod | deepspeed: its conda env and its family
    runtime: str  # the library its workers train with: torch | tensorflow
    runner: str | None  # module of trainscale.runners whose main(spec, out) trains it
    launcher: str  # single-process | torchrun | tfrun | horovodrun (trainscale.launch.commands)
    one_process: bool  # one process (which may drive several devices), else one per worker
    multi_node: bool  # may span several nodes
    one_device: bool  # one process on one device: workers = nodes = 1
    needs_gpus: bool  # more than one worker only on GPUs
    precisions: tuple[str, ...]
    comm_pattern: str  # what travels between workers in one step
    volume_factor: float | None  # v: a step's traffic in all-reduces of the gradient
    collectives: str | None  # the library its gradient traffic goes through
    colour: str  # in every figure; the row order is the strategies' order in figures
    title: str  # how reasons name it
    elastic: bool = False  # the world may shrink and grow back (Horovod elastic)
    why_gpus: str = ""  # why it needs GPUs for more than one worker
    exposed_unmeasured: str | None = None  # why its runs cannot switch gradient sync off
    constraints: tuple[Constraint, ...] = ()  # its own rules, checked before the common ones
    results_note: str = ""  # what a reader must know beside its results (tf-ps: asynchronous)
    results_mark: str = ""  # results_note in a word or two: the flag beside its rows and dots
    gpu_per_rank: str = ""  # why each rank needs a GPU of its own on CUDA (ranks may not share)


ALL_PRECISIONS = ("fp32", "fp16", "bf16")
_KERAS_FIT = "TensorFlow: Keras model.fit under a tf.distribute strategy has no switch for its "
_KERAS_FIT += "gradient all-reduce"
_HOROVOD_KERAS_FIT = "Keras model.fit with Horovod's DistributedOptimizer has no switch for its "
_HOROVOD_KERAS_FIT += "all-reduce"


def _row(name: str, framework: str, runner: str, launcher: str, colour: str, **kw) -> Strategy:
    """A strategy row with the defaults of a data-parallel strategy of one process per worker
    across nodes: all precisions, a ring all-reduce of the gradient (v = 1)."""
    facts = {
        "runtime": "torch",
        "one_process": False,
        "multi_node": True,
        "one_device": False,
        "needs_gpus": False,
        "precisions": ALL_PRECISIONS,
        "comm_pattern": "all-reduce of the gradient",
        "volume_factor": 1.0,
        "collectives": "torch.distributed",
        "title": name,
    }
    return Strategy(
        name, framework, runner=runner, launcher=launcher, colour=colour, **(facts | kw)
    )


_ONE_NODE = {"one_process": True, "multi_node": False}
_ONE_DEVICE = {
    **_ONE_NODE,
    "one_device": True,
    "comm_pattern": "none",
    "volume_factor": None,
    "collectives": None,
}
_SHARDED = {"comm_pattern": "all-gather of parameters, reduce-scatter of gradients"}
_TP_TRAFFIC = "all-reduce of activations in every layer (all-gather and reduce-scatter with "
_TP_TRAFFIC += "sequence parallelism)"
_TP_UNMEASURED = "tensor parallelism: its collectives run inside every layer's forward and "
_TP_UNMEASURED += "backward, which need their results, so they cannot be switched off to time the "
_TP_UNMEASURED += "step without them"
#: the tensor-parallel rows' common facts: bf16 or fp32, traffic of activations (no multiple of
#: the gradient's all-reduce: modelled apart, analysis/tp_traffic.py), collectives not timed
_TP = {
    "gpu_per_rank": "DTensor's collectives over gloo, the backend of ranks that share a GPU, "
    "crash with CUDA tensors (SIGSEGV in the block's all-gather, seen on an H200, with and "
    "without sequence parallelism), and NCCL refuses two ranks on one GPU",
    "precisions": ("fp32", "bf16"),
    "volume_factor": None,
    "exposed_unmeasured": _TP_UNMEASURED,
    "constraints": (tp_degree, tp_model, tp_precision),
}

#: Every strategy, in the order of figures and tables.
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        _row("torch", "torch", "pytorch", "single-process", "#0173b2", **_ONE_DEVICE),
        _row(
            "torch-dp",
            "torch",
            "pytorch",
            "single-process",
            "#de8f05",
            **_ONE_NODE,
            needs_gpus=True,
            comm_pattern="scatter, replicate and gather inside forward",
            volume_factor=None,
            collectives=None,
            title="torch-dp (nn.DataParallel)",
            why_gpus="without them nn.DataParallel silently runs one replica in one process, "
            "which is not parallel",
            exposed_unmeasured="nn.DataParallel: scatter, replicate and gather run inside "
            "forward, in one process; there is no synchronisation to switch off",
        ),
        _row("torch-ddp", "torch", "pytorch", "torchrun", "#029e73"),
        _row(
            "torch-fsdp", "torch", "pytorch", "torchrun", "#d55e00", **_SHARDED, volume_factor=1.5
        ),
        _row(
            "torch-tp",
            "torch",
            "tensor_parallel",
            "torchrun",
            "#e41a1c",
            **_TP,
            comm_pattern=_TP_TRAFFIC,
            title="torch-tp (tensor parallel)",
        ),  # fmt: skip
        _row(
            "torch-fsdp-tp",
            "torch",
            "tensor_parallel",
            "torchrun",
            "#4daf4a",
            **_TP,
            comm_pattern=f"{_SHARDED['comm_pattern']} over dp; {_TP_TRAFFIC} over tp",
            title="torch-fsdp-tp (FSDP × tensor parallel)",
        ),  # fmt: skip
        _row(
            "torch-pipeline",
            "torch",
            "pipeline",
            "torchrun",
            "#cc78bc",
            precisions=PIPELINE_PRECISIONS,
            comm_pattern="activations and gradients between neighbouring stages",
            gpu_per_rank="its activations go stage to stage over NCCL, which refuses two ranks "
            "on one GPU, and gloo cannot send CUDA tensors point to point",
            volume_factor=None,
            collectives=None,
            exposed_unmeasured="pipeline parallelism: its communication is the activations and "
            "gradients passed between stages, which the schedule needs; its cost is the "
            "pipeline bubble",
            constraints=(
                pipeline_stages,
                pipeline_microbatches,
                pipeline_precision,
                pipeline_schedule,
                arrays_only(
                    "every stage would need the loader's batches in the same order, which the "
                    "pipeline runner does not arrange"
                ),
            ),
        ),
        _row(
            "tf",
            "tensorflow",
            "tf",
            "single-process",
            "#ca9161",
            runtime="tensorflow",
            **_ONE_DEVICE,
        ),
        # tf-mirrored with workers > 1 and no GPUs runs that many logical CPU devices in one
        # process: kept (it exercises the strategy's code path); its metrics say device.logical
        _row(
            "tf-mirrored",
            "tensorflow",
            "tf",
            "single-process",
            "#fbafe4",
            runtime="tensorflow",
            **_ONE_NODE,
            comm_pattern="all-reduce of the gradient between the process's devices",
            volume_factor=1.0,
            collectives="tf.distribute",
            title="tf-mirrored (MirroredStrategy)",
            exposed_unmeasured=_KERAS_FIT,
        ),
        _row(
            "tf-multiworker",
            "tensorflow",
            "tf",
            "tfrun",
            "#949494",
            runtime="tensorflow",
            collectives="tf.distribute",
            exposed_unmeasured=_KERAS_FIT,
            constraints=(
                arrays_only(
                    "its data auto-sharding would decode every global batch on every worker "
                    "and keep its share; use tf-mirrored on one node or horovod-keras"
                ),
            ),
        ),
        # tf-ps: asynchronous by design; its traffic (each worker step pushes its gradient to
        # the servers and pulls the variables back) is no multiple of a ring all-reduce
        _row(
            "tf-ps",
            "tensorflow",
            "tf_ps",
            "tfrun",
            "#7f3c8d",
            runtime="tensorflow",
            comm_pattern="each worker step pushes its gradient to the parameter servers and "
            "pulls the variables back (asynchronous)",
            volume_factor=None,
            collectives=None,
            title="tf-ps (ParameterServerStrategy)",
            precisions=PS_PRECISIONS,
            constraints=(ps_precision, ps_tokens),
            exposed_unmeasured="ParameterServerStrategy: asynchronous, every worker step talks "
            "to the parameter servers; there is no gradient synchronisation to switch off",
            results_note="asynchronous training (ParameterServerStrategy): each worker step "
            "applies its own gradient of global/workers samples on the parameter servers "
            "without waiting for the other workers",
            results_mark="asynchronous",
        ),
        _row(
            "horovod-torch",
            "horovod",
            "horovod_torch",
            "horovodrun",
            "#ece133",
            collectives="horovod",
        ),
        _row(
            "horovod-keras",
            "horovod",
            "horovod_keras",
            "horovodrun",
            "#56b4e9",
            runtime="tensorflow",
            collectives="horovod",
            exposed_unmeasured=_HOROVOD_KERAS_FIT,
        ),
        _row(
            "horovod-torch-elastic",
            "horovod",
            "horovod_torch",
            "horovodrun",
            "#592f0d",
            collectives="horovod",
            elastic=True,
            constraints=(
                arrays_only(
                    "its loaders are split over a fixed set of ranks and cannot be re-split "
                    "when the world shrinks or grows"
                ),
            ),
        ),
        _row(
            "horovod-keras-elastic",
            "horovod",
            "horovod_keras",
            "horovodrun",
            "#1f4e79",
            runtime="tensorflow",
            collectives="horovod",
            elastic=True,
            exposed_unmeasured=_HOROVOD_KERAS_FIT,
        ),
        # DeepSpeed through torchrun, not the `deepspeed` launcher: that one always rendezvouses
        # on port 29500 (runs side by side clash) and needs a hostfile for multi-node; torchrun
        # gives free ports locally and the same srun form as torch-ddp across SLURM nodes.
        _row("deepspeed-zero0", "deepspeed", "deepspeed_zero", "torchrun", "#a23582"),
        _row("deepspeed-zero1", "deepspeed", "deepspeed_zero", "torchrun", "#3c3c3c"),
        _row("deepspeed-zero2", "deepspeed", "deepspeed_zero", "torchrun", "#b8850a"),
        _row(
            "deepspeed-zero3",
            "deepspeed",
            "deepspeed_zero",
            "torchrun",
            "#006374",
            **_SHARDED,
            volume_factor=1.5,
        ),
        # PyTorch Lightning's Trainer(strategy="ddp") under torchrun (Lightning reads its
        # environment); Lightning 2 has no Horovod strategy, so there is no row for that
        _row(
            "lightning-ddp",
            "torch",
            "lightning.ddp",
            "torchrun",
            "#792ee5",
            exposed_unmeasured="Lightning's DDP forward is its training_step, whose gradient "
            "synchronisation cannot be switched off from outside without timing Lightning itself",
            constraints=(lightning_fp16, lightning_data),
        ),
    )
}


def strategy(name: str) -> Strategy:
    """The row of strategy `name`; a KeyError names the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None


def names(**facts) -> tuple[str, ...]:
    """The strategies whose rows have all of `facts` (e.g. runner="pytorch", one_process=False),
    in catalog order."""
    return tuple(
        s.name for s in STRATEGIES.values() if all(getattr(s, k) == v for k, v in facts.items())
    )


def comm_volumes(collectives: str | None = None) -> dict[str, float]:
    """strategy -> v for every strategy with a gradient traffic model; with `collectives`, only
    those whose traffic goes through that library (the all-reduce benchmark measures
    "torch.distributed")."""
    return {
        s.name: s.volume_factor
        for s in STRATEGIES.values()
        if s.volume_factor is not None and collectives in (None, s.collectives)
    }


def strategy_colours() -> dict[str, tuple[float, float, float]]:
    """strategy -> RGB colour (0..1, as matplotlib takes it), in figure order."""
    return {
        s.name: tuple(int(s.colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
        for s in STRATEGIES.values()
    }


def exposed_unmeasured() -> dict[str, str]:
    """strategy -> why its runs cannot measure exposed communication (they cannot switch their
    gradient synchronisation off)."""
    return {s.name: s.exposed_unmeasured for s in STRATEGIES.values() if s.exposed_unmeasured}


def _placement(c: Cell) -> str | None:
    """The rules of one-process strategies and of strategies that need GPUs."""
    s = STRATEGIES[c.strategy]
    if s.one_device and c.world > 1:
        return f"{s.title} is one process on one device: needs workers=1, nodes=1"
    if not s.multi_node and c.nodes > 1:
        return f"{s.title} is one process on one node: needs nodes=1"
    if s.needs_gpus and c.workers > 1 and c.accelerator != "cuda":
        return f"{s.name} with workers>1 needs GPUs: {s.why_gpus}"
    shared = c.gpus_per_node is not None and c.workers > c.gpus_per_node
    if s.gpu_per_rank and c.accelerator == "cuda" and shared:
        return (
            f"{s.name}: {c.workers} ranks would share the node's {c.gpus_per_node} GPU(s), and "
            f"a rank needs one of its own: {s.gpu_per_rank}; use workers up to "
            f"{c.gpus_per_node} per node"
        )
    return None


def _input_kind(c: Cell) -> str | None:
    eats = c.row.input
    if eats != c.data_input:
        what = {"image": "images", "tokens": "token ids"}
        return (
            f"{c.model} trains on {what[eats]}; {c.dataset} holds {what[c.data_input]}: "
            f"pair it with a data set of {what[eats]}"
        )
    return None


def _input_side(c: Cell) -> str | None:
    need = c.row.min_side
    if c.data_input == "image" and c.input_side < need:
        side = c.input_side
        return f"{c.model} needs inputs of at least {need}×{need}; {c.dataset} is {side}×{side}"
    return None


def why_not(c: Cell) -> str | None:
    """The reason the strategy or the model cannot run `c`, or None if they can: the strategy's
    own constraints first, then where it may run, then what the model eats and its input size."""
    rules = (tp_strategies, *STRATEGIES[c.strategy].constraints, _placement, _input_kind)
    for rule in (*rules, _input_side):
        reason = rule(c)
        if reason:
            return reason
    return None

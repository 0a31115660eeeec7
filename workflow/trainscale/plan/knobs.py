"""The two matrix axes that trade speed for memory, and the cells that can take them.

- `activation_checkpointing`: `none`; `full`, every transformer block (or `blocks` entry, or
  image model stage) run under `torch.utils.checkpoint` (non-reentrant), its activations
  recomputed in the backward pass; `selective`, the outputs of matrix multiplies and attention
  kept and the rest recomputed (PyTorch's `create_selective_checkpoint_contexts`, as
  torchtitan's selective mode).
- `offload`: `none`; `optimizer`, DeepSpeed ZeRO 1-3's `offload_optimizer` (the optimizer
  state and step on the host, through DeepSpeed's CPU Adam); `params`, parameters, gradients
  and optimizer state on the host: FSDP2's `CPUOffloadPolicy`, ZeRO-3's `offload_param` (with
  its optimizer offloaded too).

A cell a strategy or model cannot run with them is dropped by the matrix with the reason
given here. Imports no framework.
"""

from __future__ import annotations

from trainscale.plan import catalog

CHECKPOINTING: tuple[str, ...] = ("none", "full", "selective")
OFFLOAD: tuple[str, ...] = ("none", "optimizer", "params")

#: what a cell with offload needs of the optimizer: DeepSpeed steps an offloaded optimizer
#: with its CPU Adam op (DeepSpeedCPUAdam), which is Adam or AdamW
CPU_ADAM_OPTIMIZERS = ("adam", "adamw")

_WHERE = "offload runs under torch-fsdp (params) and DeepSpeed ZeRO 1-3 (optimizer; params at 3)"


def why_not(
    strategy: str,
    model: str,
    checkpointing: str,
    offload: str,
    optimizer: str,
    own: object | None = None,
) -> str | None:
    """The reason `strategy` on `model` (`own`: the user's model, plan.own_models.OwnModel)
    cannot run with this checkpointing and offload, or None if it can."""
    return checkpointing_why_not(strategy, model, checkpointing, own) or offload_why_not(
        strategy, offload, optimizer
    )


def checkpointing_why_not(
    strategy: str, model: str, mode: str, own: object | None = None
) -> str | None:
    if mode == "none":
        return None
    s = catalog.STRATEGIES[strategy]
    if s.runtime != "torch":
        return (
            f"{strategy}: activation_checkpointing {mode} wraps PyTorch modules; the Keras "
            "strategies keep every activation (tf.recompute_grad is not wired in)"
        )
    if strategy == "torch-dp":
        return (
            f"torch-dp: activation_checkpointing {mode}: nn.DataParallel copies the model to "
            "each GPU at every forward, and a copied block's checkpointed forward would still "
            "run the original block; use torch-ddp"
        )
    if strategy == "deepspeed-zero3" and mode == "selective":
        return (
            "deepspeed-zero3: activation_checkpointing selective needs the same operations in "
            "the forward and its recomputation, and ZeRO-3 gathers a block's parameters inside "
            "it where its prefetch has not (an all-gather seen in one and not the other stops "
            "the backward): use full"
        )
    if own is not None:
        if not own.blocks:
            return (
                f"activation_checkpointing {mode}: {own.name} names no blocks to checkpoint "
                f"(models.{own.name}.blocks)"
            )
        return None
    row = catalog.MODELS[model]
    if mode == "selective" and not row.gpt:
        return (
            f"activation_checkpointing selective keeps matrix-multiply and attention outputs; "
            f"{model}'s stages are convolutions, which it would recompute: use full"
        )
    return None


def offload_why_not(strategy: str, offload: str, optimizer: str) -> str | None:
    if offload == "none":
        return None
    deepspeed = catalog.STRATEGIES[strategy].framework == "deepspeed"
    stage = int(strategy.removeprefix("deepspeed-zero")) if deepspeed else None
    if strategy == "torch-fsdp":
        if offload == "optimizer":
            return (
                "torch-fsdp: offload optimizer has no FSDP2 equivalent (CPUOffloadPolicy moves "
                "parameters, gradients and optimizer state together): use offload params"
            )
        return None
    if not deepspeed:
        return f"{strategy}: no offload ({_WHERE})"
    if stage == 0:
        return f"{strategy}: ZeRO stage 0 partitions nothing to offload ({_WHERE})"
    if offload == "params" and stage < 3:
        return (
            f"{strategy}: offload params is ZeRO-3's offload_param; stages 1 and 2 keep whole "
            "parameters on every rank"
        )
    if optimizer not in CPU_ADAM_OPTIMIZERS:
        return (
            f"{strategy}: offload {offload} steps the optimizer with DeepSpeed's CPU Adam; "
            f"optimizer {optimizer} has none (use adam or adamw)"
        )
    return None

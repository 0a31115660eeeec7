"""Tensor parallelism's traffic per optimizer step, for communication.csv (comm_model): the
activations the plan of trainscale/runners/torch/tp_plans.py moves inside every layer.

Counted from the plan, in all-reduces of one activation A = b·T·C elements (b the rank's batch,
T the sequence, C the width) over the tp group; an all-gather or a reduce-scatter of a full
tensor of M elements moves half an all-reduce of M. Per optimizer step of L layers:

- without sequence parallelism: (6L + 2)·A. Each block's forward all-reduces after the
  attention's and the MLP's row-parallel projections (2); its backward all-reduces the input
  gradient of each column-parallel linear (q, k, v and the MLP's first: 4). The embedding's
  lookup all-reduces once forward, the head's input gradient once backward.
- with sequence parallelism: (4L + 2.5)·A. Each block: an all-gather before and a
  reduce-scatter after attention and MLP, forward and backward (8 halves); the embedding's
  all-reduce plus an all-gather of its output gradient; the head's all-gather of its input and
  reduce-scatter of that gradient.
- both: the loss on logits split by vocabulary (`loss_parallel`) all-reduces three values per
  token in fp32 (the largest logit, the sum of exponentials, the next id's logit): 3·b·T·4
  bytes; the logits themselves are never gathered.

tests/test_tensor_parallel.py checks these counts against DTensor's CommDebugMode. Elements
are taken at the compute precision: 2 bytes under bf16, 4 in fp32 (autocast keeps some norm
outputs in fp32: the bf16 figure is a lower bound). torch-fsdp-tp adds FSDP's traffic over its
dp replicas: v = 1.5 of a gradient of params / tp elements of 4 bytes.
"""

from __future__ import annotations

from trainscale.plan import catalog

#: the all-reduces of b·T fp32 values the cross-entropy under loss_parallel runs per step
LOSS_ALLREDUCES = 3


def collectives_per_step(layers: int, sequence_parallel: bool) -> dict[str, int]:
    """The collectives one training step of a GPT of `layers` blocks runs over its tp group,
    by CommDebugMode's names (activations, and the loss's all-reduces)."""
    if sequence_parallel:
        return {"all_reduce": 1 + LOSS_ALLREDUCES, "all_gather_into_tensor": 4 * layers + 2,
                "reduce_scatter_tensor": 4 * layers + 1}  # fmt: skip
    return {"all_reduce": 6 * layers + 2 + LOSS_ALLREDUCES}


def activation_allreduces(layers: int, sequence_parallel: bool) -> float:
    """All-reduces of one activation b·T·C per step (the loss's apart)."""
    return 4 * layers + 2.5 if sequence_parallel else 6 * layers + 2.0


def tp_bytes(model: str, seq_len: int, batch: int, precision: str, sp: bool):
    """(all-reduce-equivalent bytes per step over the tp group, one activation's bytes) of a
    built-in GPT; None where `model` is not one (an own model's widths are not known)."""
    row = catalog.MODELS.get(model)
    if row is None or row.gpt is None:
        return None
    layers, _, width = row.gpt
    element = 2 if precision in ("bf16", "fp16") else 4
    activation = batch * seq_len * width * element
    loss = LOSS_ALLREDUCES * batch * seq_len * 4
    return activation_allreduces(layers, sp) * activation + loss, activation

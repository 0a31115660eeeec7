"""What every PyTorch-family runner shares besides the loop (torch_loop.py): the
precisions, the in-memory tensors, the optimizer, the sampler's length, evaluation, the peak
memory of each phase, the device sync and the torchrun exit.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainscale import data
from trainscale.measure.classes import scores, token_scores
from trainscale.measure.memory import PhasePeaks, nvml_process_reader
from trainscale.plan.matrix import RunSpec
from trainscale.runners.device_check import process_rank, require_gpu

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def leave() -> None:
    """End a torchrun worker once every rank is done, without the process-group teardown.

    Tearing down a gloo group can deadlock at exit: a gloo worker thread frees the last
    collective's tensors while holding the group's lock and waits for the GIL, while the main
    thread holds the GIL and waits for that lock in ~ProcessGroupGloo (seen here as 2-rank
    runs hanging after their metrics were written). The results are written; leave."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rank_device(
    local_rank: int, local_world_size: int, accelerator: str = "cpu"
) -> tuple[torch.device, bool]:
    """The device this rank trains on, and whether another rank of this node shares it.

    Ranks take the node's visible GPUs in turn (local rank modulo their count), so a run of
    more ranks than GPUs still starts: two ranks on one GPU is how the multi-rank CUDA code
    paths run on a one-GPU machine (`make gpu-check`). The caller must then not use NCCL,
    which refuses two ranks on one device. On `accelerator` cuda a rank without a usable GPU
    raises (runners.device_check): it never trains on the CPU."""
    if not torch.cuda.is_available():
        require_gpu(
            accelerator, f"torch {torch.__version__}", 0, torch.version.cuda, process_rank()
        )
        return torch.device("cpu"), False
    visible = torch.cuda.device_count()
    return torch.device(f"cuda:{local_rank % visible}"), local_world_size > visible


def group_backend(device: torch.device, shared: bool) -> str:
    """torch.distributed's backend for ranks on `device`: NCCL where each rank has a GPU of
    its own, gloo on CPU and where ranks share a GPU (gloo reduces CUDA tensors too)."""
    return "nccl" if device.type == "cuda" and not shared else "gloo"


def sync(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock time covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_peaks(device: torch.device) -> PhasePeaks:
    """Training's and evaluation's peak memory apart: host RSS, and allocated device memory on
    a GPU (torch's peak counter, reset with the host's at every evaluation's start and end);
    on a GPU also training's reserved peak and NVML's figure for the process."""
    if device.type != "cuda":
        return PhasePeaks()
    uuid = torch.cuda.get_device_properties(device).uuid
    return PhasePeaks(
        lambda: torch.cuda.max_memory_allocated(device),
        lambda: torch.cuda.reset_peak_memory_stats(device),
        lambda: torch.cuda.max_memory_reserved(device),
        nvml_process_reader(device.index, uuid),
    )


def to_tensors(arrays: data.Arrays, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Normalised float32 images and int64 labels, held in memory (on the GPU if there is one)
    so that feeding a step is one index operation, never a bottleneck."""
    mean = torch.tensor(arrays.mean).view(1, -1, 1, 1)
    std = torch.tensor(arrays.std).view(1, -1, 1, 1)

    def images(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x).float().div_(arrays.x_max).sub_(mean).div_(std)
        return t.to(device)

    return (
        images(arrays.train_x),
        torch.from_numpy(arrays.train_y).to(device),
        images(arrays.test_x),
        torch.from_numpy(arrays.test_y).to(device),
    )


def optimizer_implementation(spec: RunSpec, device_type: str) -> str:
    """How the optimizer steps parameters on `device_type` (config optimizer.fused): `fused`
    (one kernel for every tensor: the default of nanoGPT and torchtitan for Adam and AdamW on
    CUDA), `foreach` (a kernel per operation over all tensors: torch's default on CUDA) or
    `for-loop` (tensor by tensor: torch's default on CPU, which has no foreach kernels)."""
    if spec.fused is True:
        return "fused"
    if spec.fused == "auto" and device_type == "cuda" and spec.optimizer in ("adam", "adamw"):
        return "fused"
    return "foreach" if device_type == "cuda" else "for-loop"


def one_kind_per_group(params: list) -> list:
    """`params`, as two parameter groups where DTensors and plain tensors mix (tensor
    parallelism splits the linear layers and leaves the norms whole): torch's fused kernel
    steps a group's tensors in one call, and DTensor's dispatch refuses plain tensors among
    them. The same hyperparameters in both groups: the same update."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # none exist where it is not loaded
    if dtensor is None:
        return params
    split = [p for p in params if isinstance(p, dtensor.DTensor)]
    whole = [p for p in params if not isinstance(p, dtensor.DTensor)]
    return [{"params": split}, {"params": whole}] if split and whole else params


def make_optimizer(spec: RunSpec, params) -> torch.optim.Optimizer:
    """Adam (L2 weight decay added to the gradient), AdamW (decoupled weight decay, the usual
    transformer optimizer) or SGD, from the spec, implemented as optimizer_implementation says
    for the parameters' device; DeepSpeed and Horovod wrap this one too."""
    params = list(params)
    how = optimizer_implementation(spec, params[0].device.type if params else "cpu")
    kw = {"fused": True} if how == "fused" else {"foreach": how == "foreach"}
    if how == "fused":
        params = one_kind_per_group(params)
    if spec.optimizer in ("adam", "adamw"):
        adam = torch.optim.Adam if spec.optimizer == "adam" else torch.optim.AdamW
        return adam(
            params,
            lr=spec.lr,
            betas=spec.betas,
            eps=spec.eps,
            weight_decay=spec.weight_decay,
            **kw,
        )
    return torch.optim.SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, **kw
    )


class SkippedSteps:
    """Optimizer steps fp16's GradScaler skipped because a gradient overflowed: by design, not
    divergence (trainscale.measure.divergence). Counted on the device, so no step waits for
    it: a skipped step lowers the loss scale, a taken one never does."""

    def __init__(self) -> None:
        self.count: torch.Tensor | None = None

    @contextlib.contextmanager
    def counting(self, scaler: torch.amp.GradScaler) -> Iterator[None]:
        """Around `scaler.step` and `scaler.update` (after the scaled backward, which sets the
        scale up): counts the step if the scaler skipped it."""
        before = scaler._get_scale_async().clone()  # the tensor get_scale() would wait for
        yield
        hit = (scaler._get_scale_async() < before).to(torch.int64)
        self.count = hit if self.count is None else self.count + hit

    def total(self) -> int:
        return 0 if self.count is None else int(self.count.item())


def skipped_block(skipped: int | None) -> dict:
    """The record's `precision` block, for a run whose loss scaling can skip steps."""
    return {} if skipped is None else {"precision": {"skipped_steps": skipped}}


class Indexable:
    """A length for DistributedSampler: the training set replicated `scale` times."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss: cross-entropy of class logits (B, K) against labels (B,), or the
    next-token cross-entropy of a GPT's logits (B, T, V) against the next ids (B, T), the mean
    over all B·T predictions (as nanoGPT's); of logits split by vocabulary (tensor
    parallelism's DTensor) on each rank's share, without gathering them (tp_loss)."""
    if hasattr(out, "placements"):
        from trainscale.runners.torch.tp_loss import cross_entropy

        return cross_entropy(out, y)
    if out.dim() == 3:
        return F.cross_entropy(out.flatten(0, 1), y.flatten())
    return F.cross_entropy(out, y)


def totals_size(classes: int, tokens: bool) -> int:
    """Length of `tally`'s totals: [loss, correct, tokens] on token data, else [loss,
    confusion k×k]."""
    return 3 if tokens else 1 + classes * classes


def tally(totals: torch.Tensor, out: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> None:
    """Add one batch's weighted loss sum and confusion counts (row = true class, column =
    argmax) into `totals` = [loss sum, confusion k×k flattened], on the device: no sync. For
    a GPT's logits (B, T, V): [loss sum, correct next ids, tokens] instead (logits split by
    vocabulary, tensor parallelism's DTensor, scored where they lie: tp_plans.token_scores)."""
    if out.dim() == 3:
        if hasattr(out, "placements"):
            from trainscale.runners.torch.tp_plans import token_scores

            losses, hits = token_scores(out, y)
        else:
            losses = F.cross_entropy(out.transpose(1, 2), y, reduction="none")
            hits = out.argmax(-1) == y
        per_window = losses.double().sum(1)
        totals[0] += (per_window * w).sum()
        totals[1] += (hits.double().sum(1) * w).sum()
        totals[2] += y.shape[1] * w.sum()
        return
    k = out.shape[1]
    totals[0] += (F.cross_entropy(out, y, reduction="none").double() * w).sum()
    totals[1:] += torch.bincount(y * k + out.argmax(1), weights=w.double(), minlength=k * k)


def scored(totals: torch.Tensor, classes: int, tokens: bool = False) -> dict:
    """The `test` block's accuracy, loss and confusion from summed `tally` totals (accuracy,
    loss and perplexity per token on token data)."""
    t = totals.cpu()
    if tokens:
        return token_scores(*t.tolist())
    return scores(t[1:].view(classes, classes).tolist(), t[0].item())


def memory_eval_batches(
    x: torch.Tensor,
    y: torch.Tensor,
    rank: int,
    world: int,
    batch: int,
    image_size: tuple[int, int] | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """An in-memory test set's batches for `evaluate`: this rank's stride, in batches of the
    training's per-worker batch, resized to `image_size` as training fed them. Every rank
    yields equally many equal-sized batches (the last stride is padded with a repeated sample
    whose `counted` weight is 0)."""
    from trainscale.data.imagedata import resize_batch

    n = len(y)
    per_rank = -(-n // world)
    idx = rank + world * torch.arange(per_rank, device=y.device)
    counted = (idx < n).double()
    idx = idx.clamp(max=n - 1)
    for i in range(0, per_rank, batch):
        sel = idx[i : i + batch]
        yield resize_batch(x[sel], image_size), y[sel], counted[i : i + batch]


def loader_eval_batches(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    all_sum: Callable[[torch.Tensor], torch.Tensor],
    shape: tuple[int, ...],
    tokens: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A test loader's batches (trainscale.data.imagedata) for `evaluate`, moved to the device.
    Ranks may hold a batch more or less, so before each batch the ranks count who still has
    one; a rank that ran out repeats its last batch (or a blank one) with weight 0 until all
    have, so every rank joins every forward (a collective with sharded parameters)."""
    it = iter(batches)
    label = torch.zeros(1, dtype=torch.int64, device=device)
    last = (torch.zeros(1, *shape, device=device), label)
    if tokens:  # a blank window of ids, and its targets
        last = (torch.zeros(1, *shape, dtype=torch.int64, device=device),) * 2
    while True:
        got = next(it, None)
        if all_sum(torch.tensor([float(got is not None)], device=device)).item() == 0:
            return
        if got is None:
            yield last[0], last[1], torch.zeros(len(last[1]), dtype=torch.float64, device=device)
            continue
        last = (got[0].to(device, non_blocking=True), got[1].to(device, non_blocking=True))
        yield last[0], last[1], torch.ones(len(last[1]), dtype=torch.float64, device=device)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    device: torch.device,
    classes: int,
    all_sum: Callable[[torch.Tensor], torch.Tensor],
    input_dtype: torch.dtype | None = None,
    tokens: bool = False,
) -> dict:
    """Test accuracy, mean loss and the confusion matrix (trainscale.measure.classes.scores); each
    rank scores its `batches` (x, y, counted weight: `memory_eval_batches` or
    `loader_eval_batches`, which give every rank equally many, since with sharded parameters
    (ZeRO-3, FSDP) each forward is a collective that all ranks must join; a batch no larger
    than a training step's), then the ranks' sums are added in one collective (`all_sum`: the
    strategy's sum over ranks, returning the sum). On `tokens`, next-token accuracy, loss and
    perplexity (token ids are never cast to `input_dtype`)."""
    model.eval()
    totals = torch.zeros(totals_size(classes, tokens), dtype=torch.float64, device=device)
    for xb, yb, w in batches:
        xb = xb if input_dtype is None or tokens else xb.to(input_dtype)
        tally(totals, model(xb).float(), yb, w)
    totals = all_sum(totals)
    model.train()
    return scored(totals, classes, tokens)

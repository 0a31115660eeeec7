"""The adapter a user writes to run othergpt under trainscale's `models:` contract:
build(vocab_size, seq_len, **kwargs) -> a module whose forward(ids) returns every position's
logits. It exposes the GPT's blocks a second time, as many adapters do: `blocks` is the GPT's
own `transformer.h` (what FSDP shards as units), and `stages` is [embedding, *blocks, head],
which run the model end to end (what torch-pipeline cuts; the embedding and the head share the
tied matrix, so the pipeline keeps their copies in step)."""

from __future__ import annotations

import math

import torch
from othergpt import GPT, GPTConfig
from othergpt.model import Attention
from torch import nn


class Embed(nn.Module):
    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.wte, self.wpe = gpt.transformer["wte"], gpt.transformer["wpe"]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.ln_f, self.lm_head = gpt.transformer["ln_f"], gpt.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class OtherGPTLM(nn.Module):
    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt
        self.blocks = gpt.transformer["h"]
        self.stages = nn.ModuleList([Embed(gpt), *gpt.transformer["h"], Head(gpt)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits, _ = self.gpt(ids)
        return logits


def build(*, vocab_size: int, seq_len: int, n_layer: int = 2, n_head: int = 2,
          n_embd: int = 32) -> OtherGPTLM:  # fmt: skip
    cfg = GPTConfig(block_size=seq_len, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                    n_embd=n_embd)  # fmt: skip
    return OtherGPTLM(GPT(cfg))


def tp_plan() -> dict:
    """One block's tensor-parallel split: the MLP only (up column-, down row-parallel). The
    attention's q, k and v are one fused matrix, which a column split would cut across q, k
    and v rather than by heads, so it stays whole on every rank."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"ff.up": ColwiseParallel(), "ff.down": RowwiseParallel()}


def init_module(model: OtherGPTLM, module: nn.Module, name: str) -> None:
    """othergpt's own initialisation, one module at a time (trainscale's `init`, so the
    sharding strategies build it on the meta device): its `GPT._init`, the residual
    projections scaled by 1/sqrt(2 L), LayerNorm's defaults, and the causal mask buffer,
    which `to_empty` leaves unset, computed again."""
    if isinstance(module, Attention):
        t = module.mask.shape[-1]
        module.mask.copy_(torch.ones(t, t).tril().view(1, 1, t, t))
    elif isinstance(module, nn.LayerNorm):
        module.reset_parameters()
    GPT._init(module)
    if isinstance(module, nn.Linear) and name.endswith((".out", ".down")):
        std = 0.02 / math.sqrt(2 * model.gpt.cfg.n_layer)
        nn.init.normal_(module.weight, mean=0.0, std=std)

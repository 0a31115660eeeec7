"""GPT in PyTorch: a decoder-only transformer of the shape nanoGPT and GPT-2 use.

Pre-norm blocks (LayerNorm, causal self-attention, LayerNorm, GELU MLP of width 4C), learned
position embeddings, the LM head tied to the token embedding, no bias anywhere and no dropout.
Attention is `F.scaled_dot_product_attention(..., is_causal=True)`, so each backend picks its
fused kernel (flash attention on a GPU that has it).

Why a flat `nn.Sequential` (embedding, block 1..L, head): as for the image models, pipeline
stages are cut between top-level blocks and FSDP shards per block (`torch_models.blocks`). The
head registers the embedding's matrix as its own weight (as nanoGPT and Hugging Face's GPT-2
tie them), so `parameters()` counts it once and ZeRO-3 gathers it for either module; a
sharding that splits the two ends into different units must leave them to one (the root).

Parameter count, bias-free, with the head tied: V·C + T·C + L·(12·C² + 2·C) + C for
vocabulary V, context T, L layers of width C. GPT-2's published counts (124,439,808 for the
124M model at V = 50,257, T = 1,024) add the biases this shape leaves out: 11·C per layer
and C for the final norm (tests/test_gpt.py checks all four sizes). nanoGPT's "number of
parameters" is the same count without the position table (T·C), as is `non_embedding`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainscale.plan import catalog


class Embedding(nn.Module):
    """Token plus learned position embedding of ids (B, T) -> (B, T, C)."""

    def __init__(self, vocab: int, context: int, width: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(pos)


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: q, k and v projections, then the output one.

    Three projections rather than nanoGPT's one fused `c_attn`, and the head count read from
    the projections' width (`view(b, t, -1, head_width)`), as torchtitan's attention does: so
    tensor parallelism splits q, k and v by whole heads (column-parallel) and each rank runs
    its heads with no change here (trainscale.runners.torch.tensor_parallel). The same
    parameters and FLOPs as the fused projection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_width = width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_width).transpose(1, 2)
                   for p in (self.q, self.k, self.v))  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, bias=False)
        self.attn = SelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width, bias=False)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Head(nn.Module):
    """Final LayerNorm, then logits (B, T, V) through the token embedding's matrix (tied): an
    nn.Linear whose weight is the embedding's Parameter, as nanoGPT ties `lm_head`, so tensor
    parallelism splits it as the Linear it is."""

    def __init__(self, embedding: Embedding, width: int) -> None:
        super().__init__()
        vocab = embedding.tokens.num_embeddings
        self.ln_f = nn.LayerNorm(width, bias=False)
        self.out = nn.Linear(width, vocab, bias=False)
        self.out.weight = embedding.tokens.weight  # the same Parameter: tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln_f(x))


def build(name: str, context: int, vocab: int) -> nn.Sequential:
    """GPT `name` (a catalog row with `gpt` dimensions) for `context` tokens and `vocab` ids,
    initialised by `init_module` from torch's generator as it stands (the runners draw each
    module from a seed of its own instead: trainscale.models.init)."""
    layers, heads, width = catalog.MODELS[name].gpt
    if context < 1 or vocab < 1:
        raise ValueError(f"{name}: context and vocab must be positive, got {context}, {vocab}")
    emb = Embedding(vocab, context, width)
    net = nn.Sequential(emb, *(Block(width, heads) for _ in range(layers)), Head(emb, width))
    with torch.no_grad():
        for module_name, module in net.named_modules():
            init_module(net, module, module_name)
    return net


def init_module(net: nn.Module, module: nn.Module, name: str) -> None:
    """GPT-2's initialisation of one module's own weights: normal 0.02 for embeddings and
    linear layers, 0.02/√(2L) for the residual projections (`proj`), LayerNorm's ones (a
    trainscale.models.init `Init`; the head's matrix is the embedding's, set with it)."""
    if isinstance(module, nn.Linear | nn.Embedding):
        layers = sum(isinstance(m, Block) for m in net)
        std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj") else 0.02
        nn.init.normal_(module.weight, mean=0.0, std=std)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)


def non_embedding(net: nn.Module) -> int:
    """Parameters without the position table: nanoGPT's count, and N in 6·N per token."""
    return sum(p.numel() for p in net.parameters()) - net[0].positions.weight.numel()


def analytic_flops_per_token(name: str, context: int, vocab: int) -> float:
    """Training FLOPs per token, PaLM's appendix B: 6·N + 12·L·H·Q·T, with N the parameters
    without the position table (the head's matmul is counted through the tied embedding),
    L layers, H heads, Q = C/H the head width and T the context."""
    layers, heads, width = catalog.MODELS[name].gpt
    n = vocab * width + layers * (12 * width * width + 2 * width) + width
    return 6.0 * n + 12.0 * layers * heads * (width // heads) * context

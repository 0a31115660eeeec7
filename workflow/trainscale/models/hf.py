"""Hugging Face causal LMs built from a config alone (`matrix.model: hf:NAME`,
trainscale.plan.preflight.hf_models): the own-model builder and tensor-parallel plan trainscale
gives them.

`AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)`
builds any architecture transformers knows (Llama, Qwen2, Mistral, ...) with random weights
under the run's seed, and nothing is downloaded. Its parameters are fp32 masters in every cell,
as the built-in models' are, whatever the config's `torch_dtype` says (most Hub configs say
bfloat16, which transformers would otherwise build): bf16 is the run's autocast or FSDP's
policy, never the masters' dtype.

The module trainscale trains wraps it so that it takes a batch of token ids and returns the
logits of every position, as every token model here does; its `layers` are the decoder layers
(the modules its `_no_split_modules` names), which FSDP wraps one by one and tensor parallelism
splits by the config's own `base_model_tp_plan`; its `embedding` and `head` are the token
embedding and the LM head, which tensor parallelism splits by vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

#: transformers' names of the tensor-parallel styles that DTensor has as they are
STYLES = {"colwise": "ColwiseParallel", "rowwise": "RowwiseParallel"}


class CausalLM(nn.Module):
    """A transformers causal LM as trainscale trains it: ids (batch, T) -> logits (batch, T,
    vocab_size of the config), no cache, no loss computed inside."""

    def __init__(self, hf: nn.Module, name: str):
        super().__init__()
        self.hf = hf
        self.name = name
        self.layers = hf.get_decoder().layers  # the same modules, reachable twice

    @property
    def embedding(self) -> nn.Module:
        """The token embedding (the own-model entry's `embedding`), by transformers' own
        accessor: any architecture's, not registered a second time."""
        return self.hf.get_input_embeddings()

    @property
    def head(self) -> nn.Module:
        """The LM head (the entry's `head`), tied to the embedding's matrix or not."""
        return self.hf.get_output_embeddings()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=idx, use_cache=False).logits


def load_config(path: str):
    """The transformers config of a config.json (its `_source` note dropped)."""
    from transformers import AutoConfig

    facts = {k: v for k, v in json.loads(Path(path).read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(facts.pop("model_type"), **facts)


def build(vocab_size: int, seq_len: int, config: str, name: str, architecture: str) -> CausalLM:
    """The model of `config` (a config.json path) for data of `vocab_size` ids: ValueError
    naming both numbers where they do not fit its vocabulary (the planner checks it first, and
    drops a `seq_len` past its positions)."""
    from transformers import AutoModelForCausalLM

    cfg = load_config(config)
    if vocab_size > cfg.vocab_size:
        raise ValueError(
            f"{name}: the data's {vocab_size:,} token ids do not fit the config's vocab_size "
            f"{cfg.vocab_size:,}"
        )
    # fp32 masters whatever the config's torch_dtype says (a Hub config's "bfloat16" would
    # build bf16 parameters and Adam states): a run's precision is autocast's or FSDP's policy
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return CausalLM(hf, name)


def init_module(model: CausalLM, module: nn.Module, name: str) -> None:
    """transformers' own initialisation of one module (the model class's `_init_weights`:
    normal `initializer_range` for linear layers and embeddings, norms' ones, the rotary
    frequencies recomputed), as a trainscale.models.init `Init`."""
    model.hf._init_weights(module)


def tp_plan(config: str, **_: object) -> dict:
    """One decoder layer's plan from the config's `base_model_tp_plan` ("layers.*.self_attn.
    q_proj": "colwise", ...), as DTensor styles; the entries outside the layers (none in Llama,
    Qwen2, Mistral) and styles DTensor has no twin of are left replicated."""
    from torch.distributed.tensor import parallel

    plan = load_config(config).base_model_tp_plan or {}
    out = {}
    for key, style in plan.items():
        if key.startswith("layers.*.") and style in STYLES:
            out[key.removeprefix("layers.*.")] = getattr(parallel, STYLES[style])()
    return out

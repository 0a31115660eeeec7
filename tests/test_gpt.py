"""The GPT family (trainscale.models.gpt, keras_gpt): published sizes, the Keras twin, blocks,
and the FLOPs a training step costs (counted, and PaLM's analytic count)."""

import pytest
import torch
import torch.nn.functional as F

from trainscale.models import gpt
from trainscale.models import torch_models as models
from trainscale.plan import catalog
from trainscale.runners.torch import flop_count

GPTS = tuple(m.name for m in catalog.MODELS.values() if m.gpt)

#: Hugging Face's gpt2, gpt2-medium, gpt2-large, gpt2-xl at GPT-2's vocabulary (50,257) and
#: context (1,024): the published parameter counts, biases included
PUBLISHED_GPT2 = {
    "gpt2-124m": 124_439_808,
    "gpt2-350m": 354_823_168,
    "gpt2-774m": 774_030_080,
    "gpt2-1.5b": 1_557_611_200,
}


def meta(name: str, context: int, vocab: int) -> torch.nn.Sequential:
    with torch.device("meta"):
        return models.build(name, (context,), vocab)


def test_the_catalog_has_the_six_gpts_with_their_shapes():
    assert GPTS == ("gpt-nano", "gpt-micro", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b")
    shapes = {n: catalog.MODELS[n].gpt for n in GPTS}
    assert shapes == {
        "gpt-nano": (4, 4, 128),
        "gpt-micro": (6, 6, 384),
        "gpt2-124m": (12, 12, 768),
        "gpt2-350m": (24, 16, 1024),
        "gpt2-774m": (36, 20, 1280),
        "gpt2-1.5b": (48, 25, 1600),
    }
    assert all(catalog.MODELS[n].input == "tokens" for n in GPTS)


@pytest.mark.parametrize("name", sorted(PUBLISHED_GPT2))
def test_gpt2_sizes_are_the_published_counts_less_gpt2s_biases(name):
    layers, _, width = catalog.MODELS[name].gpt
    ours = models.param_count(meta(name, 1024, 50_257))
    biases = layers * 11 * width + width  # ln_1, qkv (3C), proj, ln_2, fc (4C), proj; ln_f
    assert ours + biases == PUBLISHED_GPT2[name]
    assert ours == catalog.MODELS[name].params


def test_nanogpts_count_is_the_one_without_the_position_table():
    net = meta("gpt2-124m", 1024, 50_304)
    # nanoGPT's gpt2 (bias=True, vocab 50,304) prints 123.69M: ours less its 12·11·768 + 768
    assert gpt.non_embedding(net) == 123_689_472 - (12 * 11 * 768 + 768)
    assert models.param_count(net) - gpt.non_embedding(net) == 1024 * 768


def test_blocks_are_embedding_layers_and_a_tied_head():
    net = meta("gpt-nano", 256, 256)
    parts = models.blocks(net)
    assert len(parts) == catalog.MODELS["gpt-nano"].blocks == 4 + 2
    assert parts[-1].out.weight is parts[0].tokens.weight  # tied: one matrix
    assert isinstance(parts[1], gpt.Block)


def test_a_training_step_on_cpu_gives_next_token_logits():
    torch.manual_seed(0)
    net = models.build("gpt-nano", (32,), 256)
    ids = torch.randint(0, 256, (2, 33))
    logits = net(ids[:, :-1])
    assert logits.shape == (2, 32, 256)
    loss = F.cross_entropy(logits.reshape(-1, 256), ids[:, 1:].reshape(-1))
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.3  # ~uniform at init
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_attention_is_causal():
    torch.manual_seed(0)
    net = models.build("gpt-nano", (16,), 64).eval()
    ids = torch.randint(0, 64, (1, 16))
    changed = ids.clone()
    changed[0, 10] = (ids[0, 10] + 1) % 64
    with torch.no_grad():
        a, b = net(ids), net(changed)
    assert torch.allclose(a[0, :10], b[0, :10])  # earlier positions cannot see position 10
    assert not torch.allclose(a[0, 10:], b[0, 10:])


@pytest.mark.parametrize(("name", "context", "vocab"), [
    ("gpt-nano", 256, 256), ("gpt-micro", 256, 50_304), ("gpt2-124m", 1024, 50_304),
])  # fmt: skip
def test_counted_flops_agree_with_palms_formula(name, context, vocab):
    counted = flop_count.per_sample(name, (context,), vocab)
    analytic = gpt.analytic_flops_per_token(name, context, vocab) * context
    # the counter sees matmuls only; the formula's 6·N also holds the LayerNorms' weights
    layers, _, width = catalog.MODELS[name].gpt
    assert counted == analytic - 6 * (2 * layers + 1) * width * context
    assert abs(counted - analytic) / analytic < 0.01


def test_keras_twin_has_the_same_parameters():
    pytest.importorskip("tensorflow")
    from trainscale.models import keras_models

    for name, context, vocab in (("gpt-nano", 256, 50_304), ("gpt-micro", 64, 256)):
        twin = keras_models.build(name, (context,), vocab)
        assert keras_models.param_count(twin) == models.param_count(meta(name, context, vocab))
        assert tuple(twin.output_shape) == (None, context, vocab)


def test_gpt_on_image_data_is_dropped_with_the_reason():
    from trainscale.plan.matrix import build_runs

    from conftest import base_config

    runs, dropped = build_runs(base_config(model=["gpt-nano", "seed-small"]))
    assert {r.model for r in runs} == {"seed-small"}
    assert any("gpt-nano trains on token ids" in d.reason for d in dropped)

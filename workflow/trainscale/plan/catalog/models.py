"""One frozen row per model: the facts the matrix, the pipeline split and the model tests read
(what it eats, blocks, smallest input side, BatchNorm, published size). Part of the catalog
(`trainscale.plan.catalog` re-exports MODELS, Model and model); imports no framework."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """One model: what it eats, its shape limits, and the size its builders are checked
    against."""

    name: str
    blocks: int  # top-level blocks (models.blocks): the most pipeline stages it splits into
    min_side: int  # smallest square input side it accepts (spatial sizes stay >= 1)
    batchnorm: bool  # training needs at least 2 samples per worker (or micro-batch)
    params: int  # parameters at the published input and classes
    published_input: tuple[int, ...]  # (channels, height, width) of `params`; (context,) for
    published_classes: int  # tokens, with the vocabulary as the classes
    input: str = "image"  # "image": (C, H, W) pixels and a label; "tokens": ids, next id
    gpt: tuple[int, int, int] | None = None  # (layers, heads, width) of a GPT
    tp_plan: bool = False  # an own model with a tensor-parallel plan (models.<name>.tp_plan)
    named_blocks: bool = False  # an own model naming its blocks (models.<name>.blocks), whether
    # or not they run it end to end (`blocks` counts them only where they do)


def _gpt(name: str, layers: int, heads: int, width: int, params: int, context: int, vocab: int):
    """A GPT row (trainscale.models.gpt): embedding, `layers` blocks and the head are its
    top-level blocks; `params` bias-free at `context` and `vocab` (GPT-2's counts with their
    biases are checked against these in tests/test_gpt.py)."""
    return Model(name, layers + 2, 1, False, params, (context,), vocab, "tokens",
                 (layers, heads, width))  # fmt: skip


_MNIST, _IMAGENET = (1, 28, 28), (3, 224, 224)

#: Every model. Blocks are checked against the built models (tests/test_fsdp_pipeline.py), the
#: minimum side against real meta-device forwards and the parameter counts against the builders
#: (tests/test_models.py): published figures (torchvision for the ImageNet models, the seed
#: scripts and the PyTorch example for the small ones; seed-large's follows from its spec).
#: The GPTs are nanoGPT's shape at GPT-2's sizes (gpt2-*: at GPT-2's vocabulary of 50,257 and
#: context of 1,024, without GPT-2's biases) and two small ones for CPU studies (at the padded
#: vocabulary of 50,304 and the default context of 256).
MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("seed-small", 3, 2, False, 402_442, _MNIST, 10),
        Model("seed-large", 6, 8, False, 4_104_202, _MNIST, 10),
        Model("mnist-convnet", 4, 16, False, 21_840, _MNIST, 10),
        Model("vgg19", 8, 32, False, 143_667_240, _IMAGENET, 1000),
        Model("resnet50", 18, 1, True, 25_557_032, _IMAGENET, 1000),
        Model("alexnet", 8, 63, False, 61_100_840, _IMAGENET, 1000),
        Model("googlenet", 11, 15, True, 6_624_904, _IMAGENET, 1000),
        _gpt("gpt-nano", 4, 4, 128, 7_259_264, 256, 50_304),
        _gpt("gpt-micro", 6, 6, 384, 30_036_864, 256, 50_304),
        _gpt("gpt2-124m", 12, 12, 768, 124_337_664, 1024, 50_257),
        _gpt("gpt2-350m", 24, 16, 1024, 354_551_808, 1024, 50_257),
        _gpt("gpt2-774m", 36, 20, 1280, 773_521_920, 1024, 50_257),
        _gpt("gpt2-1.5b", 48, 25, 1600, 1_556_764_800, 1024, 50_257),
    )
}


def model(name: str) -> Model:
    """The row of model `name`; a KeyError names the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None

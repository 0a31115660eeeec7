"""One frozen row per model: the facts the matrix, the pipeline split and the model tests read
(blocks, smallest input side, BatchNorm, published size). Part of the catalog
(`trainscale.plan.catalog` re-exports MODELS, Model and model); imports no framework."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """One model: its shape limits, and the published size its builders are checked against."""

    name: str
    blocks: int  # top-level blocks (models.blocks): the most pipeline stages it splits into
    min_side: int  # smallest square input side it accepts (spatial sizes stay >= 1)
    batchnorm: bool  # training needs at least 2 samples per worker (or micro-batch)
    params: int  # parameters at the published input and classes
    published_input: tuple[int, int, int]  # (channels, height, width) of `params`
    published_classes: int


_MNIST, _IMAGENET = (1, 28, 28), (3, 224, 224)

#: Every model. Blocks are checked against the built models (tests/test_fsdp_pipeline.py), the
#: minimum side against real meta-device forwards and the parameter counts against the builders
#: (tests/test_models.py): published figures (torchvision for the ImageNet models, the seed
#: scripts and the PyTorch example for the small ones; seed-large's follows from its spec).
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
    )
}


def model(name: str) -> Model:
    """The row of model `name`; a KeyError names the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None

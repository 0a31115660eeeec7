"""Every architecture the study matrix can name, each a flat ``nn.Sequential`` of blocks.

Why flat: pipeline parallelism cuts a model into stages between top-level blocks, and FSDP
wraps each top-level block as one shard unit (see :func:`blocks`). Grouping layers into blocks
never changes the parameter count, so the torchvision architectures keep their published sizes
(at 3x224x224, 1000 classes: vgg19 143,667,240; resnet50 25,557,032; alexnet 61,100,840;
googlenet 6,624,904). torchvision cannot be installed beside this torch build, so the
definitions live here, written from the papers and torchvision's documented layouts.

Every model returns raw logits: the training loop applies ``CrossEntropyLoss``. The GPTs
(token models) are built by trainscale.models.gpt, the same flat shape: embedding, blocks, head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from trainscale.models import gpt
from trainscale.models.builders import VGG19_STAGES, Builders
from trainscale.models.init import Gather, Init, initialise, to_empty
from trainscale.models.own import build_torch, model_blocks, resolved
from trainscale.plan import catalog
from trainscale.plan.runspec import OwnModel

#: The models this module builds: the catalog's, in its order.
MODELS: tuple[str, ...] = tuple(catalog.MODELS)

Shape = tuple[int, int, int]

#: name -> builder of each catalog model (each builder registers itself below).
_BUILDERS = Builders("PyTorch")


def build(
    name: str,
    in_shape: tuple[int, ...],
    num_classes: int,
    own: OwnModel | None = None,
    seed: int | None = None,
    meta: bool = False,
) -> nn.Module:
    """A freshly initialised model.

    ``in_shape`` is (C, H, W) for an image model, (context,) for a token model, whose classes
    are its vocabulary. The seed models size their first linear layer from H and W and raise
    ValueError when the input is too small for them; the torchvision models end in adaptive
    pooling, so a too-small input only fails at forward time.

    Without `seed`, the builder's weights from torch's generator as it stands (seed it first).
    With `seed` (the runners), a model with an initialisation of its own (`initialiser`: the
    GPT family, `hf:` models, own models with `init`) is built on the meta device and, unless
    `meta` asks for it as it is (to shard it first), materialised on the host and initialised
    module by module from `seed` (trainscale.models.init): the weights every strategy starts
    from. Any other model is built whole after `torch.manual_seed(seed)`.
    """
    init = initialiser(name, own) if seed is not None else None
    if init is None:
        if seed is not None:
            torch.manual_seed(seed)
        return _construct(name, in_shape, num_classes, own)
    with torch.device("meta"):
        net = _construct(name, in_shape, num_classes, own)
    if not meta:
        to_empty(net, "cpu")
        initialise(net, init, seed)
    return net


def _construct(
    name: str, in_shape: tuple[int, ...], num_classes: int, own: OwnModel | None
) -> nn.Module:
    if own is not None:  # the user's own model (config `models:`): its builder's module
        return build_torch(own, tuple(in_shape), num_classes)
    shape = _BUILDERS.checked(name, in_shape, num_classes)
    return _BUILDERS[name](shape, num_classes)


def initialiser(name: str, own: OwnModel | None = None) -> Init | None:
    """The model's own initialisation of one module (trainscale.models.init): GPT-2's for the
    GPT family, an own model's `init` (transformers' for `hf:` models); None for the image
    models, whose builders initialise the whole model at once."""
    if own is not None:
        return resolved(own, "init") if own.init else None
    row = catalog.MODELS.get(name)  # (an unknown name is the builders' error to give)
    return gpt.init_module if row is not None and row.gpt else None


def initialise_module_wise(
    net: nn.Module, name: str, own: OwnModel | None, seed: int, gather: Gather | None = None
) -> None:
    """Initialise `net` (its storage allocated: whole, sharded or partitioned) as `build` does
    with `seed`."""
    init = initialiser(name, own)
    if init is None:
        raise ValueError(f"{name} has no initialisation of its own modules; build it whole")
    initialise(net, init, seed, gather)


def fake_forward() -> FakeTensorMode:
    """Where a model built on the meta device runs forward (and backward): under fake tensors,
    shapes only, as under a tracer. A library that reads a value where it is not tracing
    (transformers' check for packed sequences) raises on bare meta tensors."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def param_count(model: nn.Module) -> int:
    """Number of trainable parameters (works on meta-device models, and on ZeRO-3's
    partitioned ones, whose `ds_numel` is the whole tensor's)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)


def blocks(model: nn.Module, own: OwnModel | None = None) -> list[nn.Module]:
    """Top-level blocks of a model from :func:`build`; of the user's own model, the modules
    its `blocks` attribute holds (none without one).

    These are the units the distributed runners split on: pipeline stages are cut between
    consecutive blocks, and FSDP wraps each block as its own shard unit.
    """
    if own is not None:
        return list(model_blocks(model, own.blocks)) if own.blocks else []
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"expected an nn.Sequential from build(), got {type(model).__name__}")
    return list(model)


# --- shape arithmetic for the models whose linear layers depend on the input size ----------


def _flat_features(
    name: str, in_shape: Shape, channels: int, windows: Sequence[tuple[int, int]]
) -> int:
    """Flattened size of a feature map after the unpadded (kernel, stride) windows given.

    Padded 3x3 convs keep the size and are left out. A side that would vanish raises
    ValueError here rather than building a ``Linear(0, ...)`` that fails later.
    """
    _, h, w = in_shape
    oh, ow = _shrink(h, windows), _shrink(w, windows)
    if oh < 1 or ow < 1:
        raise ValueError(f"{name} does not fit input {in_shape}: its feature map vanishes")
    return channels * oh * ow


def _shrink(side: int, windows: Sequence[tuple[int, int]]) -> int:
    """Side after a chain of unpadded (kernel, stride) windows; 0 once it vanishes."""
    for kernel, stride in windows:
        if side < kernel:
            return 0
        side = (side - kernel) // stride + 1
    return side


# --- seed models (the original benchmark scripts' networks) ---------------------------------


@_BUILDERS.builds("seed-small")
def _seed_small(in_shape: Shape, num_classes: int) -> nn.Sequential:
    """Seed benchmark's small CNN: one conv stage, a 64-unit hidden layer (402,442 on MNIST)."""
    flat = _flat_features("seed-small", in_shape, 32, [(2, 2)])
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(in_shape[0], 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(flat, 64), nn.ReLU()),
        nn.Linear(64, num_classes),
    )


@_BUILDERS.builds("seed-large")
def _seed_large(in_shape: Shape, num_classes: int) -> nn.Sequential:
    """Seed benchmark's large CNN: three conv stages (128/256/512) and two 512-unit layers."""
    stages: list[nn.Module] = []
    channels = in_shape[0]
    for width in (128, 256, 512):
        stages.append(
            nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        )
        channels = width
    flat = _flat_features("seed-large", in_shape, 512, [(2, 2)] * 3)
    return nn.Sequential(
        *stages,
        nn.Sequential(nn.Flatten(), nn.Linear(flat, 512), nn.ReLU()),
        nn.Sequential(nn.Linear(512, 512), nn.ReLU()),
        nn.Linear(512, num_classes),
    )


@_BUILDERS.builds("mnist-convnet")
def _mnist_convnet(in_shape: Shape, num_classes: int) -> nn.Sequential:
    """The classic PyTorch MNIST example net (21,840 params on MNIST), minus its log_softmax."""
    flat = _flat_features("mnist-convnet", in_shape, 20, [(5, 1), (2, 2), (5, 1), (2, 2)])
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(in_shape[0], 10, 5), nn.MaxPool2d(2), nn.ReLU()),
        nn.Sequential(nn.Conv2d(10, 20, 5), nn.Dropout2d(), nn.MaxPool2d(2), nn.ReLU()),
        nn.Sequential(nn.Flatten(), nn.Linear(flat, 50), nn.ReLU(), nn.Dropout()),
        nn.Linear(50, num_classes),
    )


# --- VGG-19 and AlexNet ----------------------------------------------------------------------


@_BUILDERS.builds("vgg19")
def _vgg19(in_shape: Shape, num_classes: int) -> nn.Sequential:
    """torchvision vgg19 (config E, no BN): five conv stages, then three FC blocks.

    The 25088->4096 layer alone holds most of the weights, so it is its own block.
    """
    stages: list[nn.Module] = []
    channels = in_shape[0]
    for widths in VGG19_STAGES:
        layers: list[nn.Module] = []
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
            channels = width
        stages.append(nn.Sequential(*layers, nn.MaxPool2d(2)))
    model = nn.Sequential(
        *stages,
        nn.Sequential(
            nn.AdaptiveAvgPool2d(7),
            nn.Flatten(),
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
        ),
        nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout()),
        nn.Linear(4096, num_classes),
    )
    _he_init_convs(model)
    for m in model.modules():
        if isinstance(m, nn.Linear):  # torchvision's VGG init: small normal FC weights
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
    return model


@_BUILDERS.builds("alexnet")
def _alexnet(in_shape: Shape, num_classes: int) -> nn.Sequential:
    """torchvision alexnet ("one weird trick" variant): five conv blocks, three FC blocks."""
    return nn.Sequential(
        nn.Sequential(
            nn.Conv2d(in_shape[0], 64, 11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
        ),
        nn.Sequential(
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2)
        ),
        nn.Sequential(nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True)),
        nn.Sequential(nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True)),
        nn.Sequential(
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2)
        ),
        nn.Sequential(
            nn.AdaptiveAvgPool2d(6),
            nn.Flatten(),
            nn.Dropout(),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
        ),
        nn.Sequential(nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(inplace=True)),
        nn.Linear(4096, num_classes),
    )


# --- ResNet-50 -------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (carries the stride), 1x1 expand x4, + shortcut.

    Putting the stride in the 3x3 conv (not the first 1x1) is what torchvision and the
    published ImageNet numbers use.
    """

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


@_BUILDERS.builds("resnet50")
def _resnet50(in_shape: Shape, num_classes: int) -> nn.Sequential:
    """torchvision resnet50: stem, the 16 bottlenecks of layer1..layer4 (3, 4, 6, 3), head."""
    stem = nn.Sequential(
        nn.Conv2d(in_shape[0], 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    )
    body: list[nn.Module] = []
    channels = 64
    for width, depth, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(depth):
            body.append(Bottleneck(channels, width, stride if i == 0 else 1))
            channels = width * Bottleneck.expansion
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))
    model = nn.Sequential(stem, *body, head)
    _he_init_convs(model)
    return model


# --- GoogLeNet -------------------------------------------------------------------------------


class BasicConv2d(nn.Sequential):
    """GoogLeNet's unit: bias-free conv (BN makes a bias redundant), BN(eps=1e-3), ReLU."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel: int, stride: int = 1, padding: int = 0
    ) -> None:
        super().__init__(
            nn.Conv2d(
                in_channels, out_channels, kernel, stride=stride, padding=padding, bias=False
            ),
            nn.BatchNorm2d(out_channels, eps=0.001),
            nn.ReLU(inplace=True),
        )


class Inception(nn.Module):
    """Four parallel branches joined on channels: 1x1 | 1x1->3x3 | 1x1->"5x5" | pool->1x1.

    The "5x5" branch really uses a 3x3 kernel, as torchvision's does (pytorch/vision#906);
    keeping that quirk is what makes the parameter count match the published 6,624,904.
    """

    def __init__(
        self,
        in_channels: int,
        ch1x1: int,
        ch3x3_reduce: int,
        ch3x3: int,
        ch5x5_reduce: int,
        ch5x5: int,
        pool_proj: int,
    ) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [
                BasicConv2d(in_channels, ch1x1, 1),
                nn.Sequential(
                    BasicConv2d(in_channels, ch3x3_reduce, 1),
                    BasicConv2d(ch3x3_reduce, ch3x3, 3, padding=1),
                ),
                nn.Sequential(
                    BasicConv2d(in_channels, ch5x5_reduce, 1),
                    BasicConv2d(ch5x5_reduce, ch5x5, 3, padding=1),
                ),
                nn.Sequential(
                    nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True),
                    BasicConv2d(in_channels, pool_proj, 1),
                ),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


def _ceil_pool(kernel: int) -> nn.MaxPool2d:
    """GoogLeNet's stride-2 max pool; ceil_mode keeps the 224 -> 7 spatial schedule."""
    return nn.MaxPool2d(kernel, stride=2, ceil_mode=True)


@_BUILDERS.builds("googlenet")
def _googlenet(in_shape: Shape, num_classes: int) -> nn.Sequential:
    """torchvision googlenet without aux classifiers and with transform_input=False.

    Each stride-2 pool between inception groups rides with the inception after it, so every
    block has parameters to shard.
    """
    model = nn.Sequential(
        nn.Sequential(
            BasicConv2d(in_shape[0], 64, 7, stride=2, padding=3),
            _ceil_pool(3),
            BasicConv2d(64, 64, 1),
            BasicConv2d(64, 192, 3, padding=1),
            _ceil_pool(3),
        ),
        Inception(192, 64, 96, 128, 16, 32, 32),
        Inception(256, 128, 128, 192, 32, 96, 64),
        nn.Sequential(_ceil_pool(3), Inception(480, 192, 96, 208, 16, 48, 64)),
        Inception(512, 160, 112, 224, 24, 64, 64),
        Inception(512, 128, 128, 256, 24, 64, 64),
        Inception(512, 112, 144, 288, 32, 64, 64),
        Inception(528, 256, 160, 320, 32, 128, 128),
        nn.Sequential(_ceil_pool(2), Inception(832, 256, 160, 320, 32, 128, 128)),
        Inception(832, 384, 192, 384, 48, 128, 128),
        nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(1024, num_classes)
        ),
    )
    for m in model.modules():  # torchvision's GoogLeNet init: truncated normal, std 0.01
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.trunc_normal_(m.weight, mean=0.0, std=0.01, a=-2.0, b=2.0)
    return model


def _he_init_convs(model: nn.Module) -> None:
    """torchvision's ResNet/VGG conv init (He normal, fan-out): trains from scratch as published."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _gpt_builder(name: str) -> None:
    @_BUILDERS.builds(name)
    def _build(in_shape: tuple[int], vocab: int) -> nn.Sequential:
        return gpt.build(name, in_shape[0], vocab)


for _gpt_name in (m.name for m in catalog.MODELS.values() if m.gpt):
    _gpt_builder(_gpt_name)

_BUILDERS.check_complete()

"""Model zoo: published sizes, flat block structure, real CPU steps and input-size limits.

Big models are built on the meta device: parameter counts and shape checks need no memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from trainscale.models.torch_models import MODELS, blocks, build, param_count
from trainscale.plan import catalog

MNIST = (1, 28, 28)
DIGITS = (1, 8, 8)
IMAGENET = (3, 224, 224)

# Published figures (the catalog's: torchvision for the ImageNet models, the seed scripts /
# PyTorch example for the small ones; seed-large follows from its spec, flat 4608 on MNIST).
PUBLISHED: dict[str, tuple[tuple[int, ...], int, int]] = {
    m.name: (m.published_input, m.published_classes, m.params) for m in catalog.MODELS.values()
}
#: the image classifiers (the GPTs, token models, have tests/test_gpt.py)
IMAGE_MODELS = tuple(m for m in MODELS if catalog.MODELS[m].input == "image")

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


def _meta_build(name: str) -> nn.Sequential:
    in_shape, num_classes, _ = PUBLISHED[name]
    with torch.device("meta"):
        return build(name, in_shape, num_classes)


def _fits(name: str, channels: int, side: int, batch: int = 2) -> bool:
    """Whether build plus a training-mode forward work at channels x side x side (on meta)."""
    try:
        with torch.device("meta"):
            model = build(name, (channels, side, side), 10)
        model.train()
        out = model(torch.empty(batch, channels, side, side, device="meta"))
    except (ValueError, RuntimeError):
        return False
    assert out.shape == (batch, 10)
    return True


def test_models_match_the_config_schema() -> None:
    """The schema names every built model (matrix.model takes them, or a user's own model,
    by a name pattern: trainscale.plan.preflight.own_models), and every one has a published size."""
    schema = yaml.safe_load(SCHEMA.read_text())
    described = schema["properties"]["matrix"]["properties"]["model"]["items"]["description"]
    assert all(name in described for name in MODELS)
    assert set(PUBLISHED) == set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_param_count_matches_published(name: str) -> None:
    assert param_count(_meta_build(name)) == PUBLISHED[name][2]


@pytest.mark.parametrize("name", MODELS)
def test_model_is_flat_sequential_of_blocks(name: str) -> None:
    model = _meta_build(name)
    assert isinstance(model, nn.Sequential)
    parts = blocks(model)
    assert parts == list(model)
    assert len(parts) >= 3
    # Every block owns parameters, so each pipeline stage / FSDP unit has something to hold.
    assert all(param_count(block) > 0 for block in parts)
    # a parameter two blocks share (a GPT's tied embedding and head) counts in both
    seen: dict[int, int] = {}
    for block in parts:
        for p in block.parameters():
            seen[id(p)] = seen.get(id(p), 0) + 1
    shared = sum(p.numel() * (seen[id(p)] - 1) for p in model.parameters())
    assert sum(param_count(block) for block in parts) == param_count(model) + shared


def test_resnet50_and_googlenet_block_layout() -> None:
    resnet = blocks(_meta_build("resnet50"))
    assert len(resnet) == 1 + (3 + 4 + 6 + 3) + 1  # stem, every bottleneck, head
    assert len(blocks(_meta_build("googlenet"))) == 11  # stem, 9 inceptions, head


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_models_return_raw_logits(name: str) -> None:
    # The last module run is the classifier Linear: no softmax for CrossEntropyLoss to double.
    assert isinstance(list(_meta_build(name).modules())[-1], nn.Linear)


def test_blocks_rejects_non_sequential() -> None:
    with pytest.raises(TypeError):
        blocks(nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("name", "in_shape"),
    [
        ("seed-small", MNIST),
        ("seed-large", MNIST),
        ("mnist-convnet", MNIST),
        ("seed-small", DIGITS),
        ("seed-large", DIGITS),
    ],
)
def test_seed_models_train_step_on_cpu(name: str, in_shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build(name, in_shape, 10).train()
    logits = model(torch.randn(2, *in_shape))
    assert logits.shape == (2, 10)
    loss = F.cross_entropy(logits, torch.tensor([3, 7]))
    loss.backward()
    assert torch.isfinite(loss)
    for param in model.parameters():
        assert param.grad is not None
        assert torch.isfinite(param.grad).all()


def test_mnist_convnet_rejects_digits_at_build_time() -> None:
    with pytest.raises(ValueError, match="mnist-convnet"):
        build("mnist-convnet", DIGITS, 10)


@pytest.mark.parametrize("name", ["resnet50", "googlenet"])
def test_batchnorm_models_forward_on_cifar_sized_input(name: str) -> None:
    torch.manual_seed(0)
    model = build(name, (3, 32, 32), 10).train()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        train_out = model(x)
        bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
        assert int(bn.num_batches_tracked) == 1  # training-mode BN updated its statistics
        eval_out = model.eval()(x)
    for out in (train_out, eval_out):
        assert out.shape == (2, 10)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["seed-small", "mnist-convnet", "resnet50", "googlenet"])
def test_same_seed_gives_same_initial_weights(name: str) -> None:
    in_shape = MNIST if name in ("seed-small", "mnist-convnet") else (3, 32, 32)

    def weights(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build(name, in_shape, 10).state_dict()

    first, again, other = weights(0), weights(0), weights(1)
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(ValueError, match="nope") as err:
        build("nope", MNIST, 10)
    for name in MODELS:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("in_shape", "num_classes"), [((28, 28), 10), ((1, 0, 28), 10), (MNIST, 0)]
)
def test_bad_shapes_are_rejected(in_shape: tuple[int, ...], num_classes: int) -> None:
    with pytest.raises(ValueError):
        build("seed-small", in_shape, num_classes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def min_side() -> dict[str, int]:
    """The catalog's smallest input side of every model."""
    return {m.name: m.min_side for m in catalog.MODELS.values()}


def test_min_side_table_covers_every_model(min_side: dict[str, int]) -> None:
    assert set(min_side) == set(MODELS)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_min_side_matches_meta_forward(name: str, min_side: dict[str, int]) -> None:
    least = min_side[name]
    # The dataset sides, plus both sides of the boundary so the table is exact, not just safe.
    sides = sorted({8, 28, 32, 224, least, least - 1} - {0})
    for channels in (1, 3):
        for side in sides:
            assert _fits(name, channels, side) == (side >= least), (name, channels, side)

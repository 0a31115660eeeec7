"""The Keras zoo is the PyTorch zoo: equal parameter counts for every model and dataset shape,
and equal outputs once the PyTorch weights are copied over (padding, pooling, flatten order).

The seed repository's Keras models had other sizes than its PyTorch ones (valid padding); these
tests are what keeps that from coming back. Big models are counted in a TensorFlow graph
context, where building a layer creates its variables' ops but allocates no weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainscale import data
from trainscale.models import keras_models
from trainscale.models import torch_models as models
from trainscale.models.keras_models import keras, tf
from trainscale.plan import catalog


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Both frameworks on one thread here (the machine is shared); torch's setting restored."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # possible only before TensorFlow's runtime starts
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass
    yield
    torch.set_num_threads(n)


#: the image classifiers (the GPTs' Keras twins: tests/test_gpt.py)
IMAGE_MODELS = tuple(m for m in models.MODELS if catalog.MODELS[m].input == "image")
#: every distinct (shape, classes) a dataset can have, named by its first dataset
SHAPES: dict[tuple, str] = {}
for _name in data.DATASETS:
    _i = data.info(_name)
    if _i.input != "image":
        continue
    SHAPES.setdefault((_i.shape, _i.num_classes), _name)

PAIRS = [
    pytest.param(model, shape, classes, id=f"{model}-{name}")
    for model in IMAGE_MODELS
    for (shape, classes), name in SHAPES.items()
    if min(shape[1:]) >= catalog.MODELS[model].min_side
]


def torch_count(model: str, shape, classes: int) -> int:
    with torch.device("meta"):
        return models.param_count(models.build(model, shape, classes))


def test_every_model_and_shape_is_covered():
    assert keras_models.MODELS == models.MODELS
    assert {p.values[0] for p in PAIRS} == set(IMAGE_MODELS)
    assert len(PAIRS) == 21  # 7 models × 4 shapes, less the pairs a model's minimum side refuses


@pytest.mark.parametrize("model, shape, classes", PAIRS)
def test_keras_parameter_count_equals_pytorch(model, shape, classes):
    expected = torch_count(model, shape, classes)
    if expected > 50_000_000:  # build without allocating: variables in a graph are never filled
        with tf.Graph().as_default():
            got = keras_models.param_count(keras_models.build(model, shape, classes))
    else:
        got = keras_models.param_count(keras_models.build(model, shape, classes))
        keras.backend.clear_session()
    assert got == expected


def test_too_small_inputs_are_refused_as_in_pytorch():
    with pytest.raises(ValueError, match="does not fit"):
        keras_models.build("mnist-convnet", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="unknown model"):
        keras_models.build("lenet", (1, 28, 28), 10)


@pytest.mark.parametrize(
    "side, size", [(1, 7), (7, 7), (14, 7), (13, 6), (5, 3), (4, 1), (9, 6), (2, 7)]
)
def test_adaptive_average_pool_matches_pytorch(side, size):
    x = np.random.default_rng(side * 100 + size).random((2, 3, side, side), dtype=np.float32)
    want = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(x), size).numpy()
    got = keras_models.AdaptiveAvgPool2D(size)(tf.constant(x.transpose(0, 2, 3, 1))).numpy()
    np.testing.assert_allclose(got.transpose(0, 3, 1, 2), want, rtol=1e-5, atol=1e-6)


# --- same weights, same outputs -----------------------------------------------------------------


def _weighted_keras_layers(model) -> list:
    """Conv, BatchNorm and Dense layers in creation order (their names are kind_NNN)."""
    named = [lay for lay in model.layers if lay.name.split("_")[0] in {"conv", "bn", "dense"}]
    return sorted(named, key=lambda lay: int(lay.name.rsplit("_", 1)[1]))


def _flatten_source_shape(layer) -> tuple[int, ...] | None:
    """(H, W, C) of the map a Dense layer's Flatten flattened, or None if it has no Flatten."""
    src = layer.input._keras_history.layer
    while isinstance(src, keras.layers.Dropout):
        src = src.input._keras_history.layer
    if isinstance(src, keras.layers.Flatten):
        return tuple(src.input.shape[1:])
    return None


def copy_torch_weights(net: torch.nn.Module, model) -> None:
    """Load a PyTorch model's weights into its Keras twin (NCHW -> NHWC, (out, in) -> (in, out))."""
    mods = [
        m
        for m in net.modules()
        if isinstance(m, torch.nn.Conv2d | torch.nn.BatchNorm2d | torch.nn.Linear)
    ]
    klayers = _weighted_keras_layers(model)
    assert [type(m).__name__ for m in mods] == [
        {"conv": "Conv2d", "bn": "BatchNorm2d", "dense": "Linear"}[k.name.split("_")[0]]
        for k in klayers
    ]
    for m, k in zip(mods, klayers, strict=True):
        t = {n: p.detach().numpy() for n, p in [*m.named_parameters(), *m.named_buffers()]}
        if isinstance(m, torch.nn.Conv2d):
            ws = [t["weight"].transpose(2, 3, 1, 0)] + ([t["bias"]] if m.bias is not None else [])
        elif isinstance(m, torch.nn.BatchNorm2d):
            ws = [t["weight"], t["bias"], t["running_mean"], t["running_var"]]
        else:
            w = t["weight"].T  # (in, out), torch's input order c·H·W + h·W + w
            hwc = _flatten_source_shape(k)
            if hwc and hwc[0] * hwc[1] > 1:
                h, wd, c = hwc
                torch_index = np.arange(c * h * wd).reshape(c, h, wd).transpose(1, 2, 0).ravel()
                w = w[torch_index]
            ws = [w, t["bias"]]
        k.set_weights(ws)


EQUIVALENCE = [
    ("seed-small", (1, 8, 8)),
    ("seed-large", (1, 8, 8)),
    ("mnist-convnet", (1, 28, 28)),
    ("alexnet", (3, 67, 67)),
    ("resnet50", (3, 33, 33)),
    ("googlenet", (1, 29, 29)),
]  # vgg19 is 3x3 "same" convs (as in seed-large) and the adaptive pool tested above


@pytest.mark.slow
@pytest.mark.parametrize("model, shape", EQUIVALENCE, ids=[m for m, _ in EQUIVALENCE])
def test_same_weights_give_the_same_outputs(model, shape):
    """Odd sides on purpose: strided layers and ceil-mode pools then pad asymmetrically in Keras'
    "same" mode, which would show here as different outputs."""
    torch.manual_seed(0)
    net = models.build(model, shape, 10).eval()
    with torch.no_grad():  # non-trivial running statistics, so eval-mode BatchNorm is tested
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    kmodel = keras_models.build(model, shape, 10)
    copy_torch_weights(net, kmodel)
    x = np.random.default_rng(0).standard_normal((2, *shape), dtype=np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    got = kmodel(tf.constant(x.transpose(0, 2, 3, 1)), training=False).numpy()
    scale = np.abs(want).max()
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-4)
    del kmodel
    keras.backend.clear_session()

"""The architectures of `trainscale.models.torch_models`, in Keras (tf-keras 2, channels-last),
layer for layer.

Every builder here mirrors its PyTorch twin block by block, so a TensorFlow run trains the same
network as a PyTorch run: the same layers in the same order, the same padding (PyTorch's
explicit symmetric padding, never Keras' asymmetric ``"same"`` on strided layers: a strided
layer gets a ``ZeroPadding2D`` and a ``"valid"`` window; stride-1 odd kernels use ``"same"``,
which is the same thing), the same biases (none before BatchNorm), BatchNorm with PyTorch's
epsilon and its running-average momentum (PyTorch's 0.1 is Keras' 0.9), adaptive average
pooling where torchvision has it, and PyTorch's default initialisation (U(±1/√fan_in) for
weights and biases) unless the PyTorch model overrides it (He fan-out convs in VGG/ResNet,
N(0, 0.01) in VGG's classifier and GoogLeNet). The parameter counts are equal for every model
and input shape (tests/test_keras_models.py), and with the same weights the outputs are equal.

The seed repository's Keras models used ``"valid"`` padding and so had other sizes than its
PyTorch ones; that is the mistake this module exists not to repeat.

Images are (H, W, C) here; ``build`` takes the PyTorch (C, H, W) shape so both model zoos are
called alike. Models return raw logits (float32 even under a mixed-precision policy). This
module imports TensorFlow and tf-keras, never torch.
"""

from __future__ import annotations

import functools
import itertools
import math
import os

import numpy as np

# tf.keras = tf-keras 2 (see runners/tensorflow/tf.py)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from tf_keras import layers  # noqa: E402

from trainscale.models import keras_gpt  # noqa: E402
from trainscale.models.builders import VGG19_STAGES, Builders  # noqa: E402
from trainscale.models.own import build_keras  # noqa: E402
from trainscale.plan import catalog  # noqa: E402
from trainscale.plan.runspec import OwnModel  # noqa: E402

#: The models this module builds: the catalog's, in its order.
MODELS: tuple[str, ...] = tuple(catalog.MODELS)

Shape = tuple[int, int, int]

#: name -> builder of each catalog model (each builder registers itself below).
_BUILDERS = Builders("Keras")


def build(
    name: str, in_shape: tuple[int, ...], num_classes: int, own: OwnModel | None = None
) -> keras.Model:
    """A freshly initialised Keras model; call `keras.utils.set_random_seed` first.

    ``in_shape`` is (C, H, W) as in `trainscale.models.torch_models.build`; the model takes
    (N, H, W, C). A token model (a GPT: trainscale.models.keras_gpt) takes (context,), its
    classes being its vocabulary, and (N, context) ids.
    Raises ValueError when the input is too small for the model, as the PyTorch zoo does.
    """
    if own is not None:  # the user's own twin (config `models:`)
        return build_keras(own, tuple(in_shape), num_classes)
    shape = _BUILDERS.checked(name, in_shape, num_classes)
    if catalog.MODELS[name].input == "tokens":
        return _BUILDERS[name](shape[0], num_classes)
    c, h, w = shape
    global _seq
    _seq = itertools.count(1)
    inputs = keras.Input(shape=(h, w, c), name="images")
    try:
        logits = _BUILDERS[name](inputs, num_classes)
    except ValueError as e:  # a window larger than the feature map
        raise ValueError(f"{name} does not fit input {in_shape}: its feature map vanishes") from e
    if keras.mixed_precision.global_policy().compute_dtype != "float32":
        logits = layers.Activation("linear", dtype="float32", name="logits_fp32")(logits)
    return keras.Model(inputs, logits, name=name)


def param_count(model: keras.Model) -> int:
    """Trainable parameters: what `trainscale.models.torch_models.param_count` counts in PyTorch
    (BatchNorm's moving mean and variance are buffers there and non-trainable weights here)."""
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


#: Weighted layers are named kind_NNN in creation order, which is PyTorch's module order (the
#: equivalence test pairs the two models' layers by it).
_seq = itertools.count(1)


def _name(kind: str) -> str:
    return f"{kind}_{next(_seq):03d}"


# --- initialisers: PyTorch's, so that "the same model" starts from the same distribution ------


def _torch_default(fan_in: int, bias: bool = True) -> dict:
    """nn.Conv2d / nn.Linear defaults: kaiming_uniform(a=√5) = U(±1/√fan_in), bias the same."""
    bound = 1.0 / math.sqrt(fan_in)
    kw: dict = {
        "kernel_initializer": keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform")
    }
    if bias:
        kw["bias_initializer"] = keras.initializers.RandomUniform(-bound, bound)
    return kw


def _he_fan_out() -> dict:
    """torchvision's ResNet/VGG conv init: kaiming_normal(fan_out, relu), zero bias."""
    return {
        "kernel_initializer": keras.initializers.VarianceScaling(
            2.0, "fan_out", "untruncated_normal"
        ),
        "bias_initializer": "zeros",
    }


def _normal(std: float, fan_in: int | None = None) -> dict:
    """N(0, std) weights; zero bias, or PyTorch's default bias when fan_in is given."""
    kw: dict = {"kernel_initializer": keras.initializers.RandomNormal(0.0, std)}
    if fan_in is None:
        kw["bias_initializer"] = "zeros"
    else:
        bound = 1.0 / math.sqrt(fan_in)
        kw["bias_initializer"] = keras.initializers.RandomUniform(-bound, bound)
    return kw


# --- layers ----------------------------------------------------------------------------------


def _conv(
    x,
    filters: int,
    kernel: int,
    stride: int = 1,
    padding: int = 0,
    bias: bool = True,
    init: str = "torch",
):
    """nn.Conv2d(in, filters, kernel, stride, padding, bias) in Keras."""
    fan_in = x.shape[-1] * kernel * kernel
    inits = {
        "torch": lambda: _torch_default(fan_in, bias),
        "he": _he_fan_out,
        "normal": lambda: _normal(0.01),
    }[init]()
    if not bias:
        inits.pop("bias_initializer", None)
    mode = "valid"
    if padding:
        if stride == 1 and kernel % 2 == 1 and padding == kernel // 2:
            mode = "same"  # stride 1, odd kernel: "same" is exactly PyTorch's symmetric padding
        else:
            x = layers.ZeroPadding2D(padding)(x)
    return layers.Conv2D(
        filters, kernel, strides=stride, padding=mode, use_bias=bias, name=_name("conv"), **inits
    )(x)


def _dense(x, units: int, init: str = "torch"):
    fan_in = x.shape[-1]
    inits = {"torch": lambda: _torch_default(fan_in), "normal": lambda: _normal(0.01)}[init]()
    return layers.Dense(units, name=_name("dense"), **inits)(x)


def _bn(x, eps: float = 1e-5):
    """nn.BatchNorm2d(eps): PyTorch's momentum 0.1 (new-batch weight) is Keras' 0.9."""
    return layers.BatchNormalization(momentum=0.9, epsilon=eps, name=_name("bn"))(x)


def _relu(x):
    return layers.ReLU()(x)


def _max_pool(x, kernel: int, stride: int | None = None):
    """nn.MaxPool2d(kernel, stride) (floor mode, no padding)."""
    return layers.MaxPooling2D(kernel, strides=stride or kernel, padding="valid")(x)


def _ceil_out(side: int, kernel: int, stride: int) -> int:
    """Output side of PyTorch's ceil_mode max pool without padding (a window must start inside)."""
    out = -(-(side - kernel) // stride) + 1
    if (out - 1) * stride >= side:
        out -= 1
    return out


def _ceil_pool(x, kernel: int, stride: int = 2):
    """nn.MaxPool2d(kernel, stride, ceil_mode=True): pad bottom/right to cover the last window.

    Padding with zeros is exact here: every such pool follows a ReLU (inputs >= 0) and every
    window holds at least one real element.
    """
    h, w = x.shape[1], x.shape[2]
    ph = max(0, (_ceil_out(h, kernel, stride) - 1) * stride + kernel - h)
    pw = max(0, (_ceil_out(w, kernel, stride) - 1) * stride + kernel - w)
    if ph or pw:
        x = layers.ZeroPadding2D(((0, ph), (0, pw)))(x)
    return layers.MaxPooling2D(kernel, strides=stride, padding="valid")(x)


def _pool_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) averaging weights of nn.AdaptiveAvgPool over one axis: output i averages
    inputs floor(i·n_in/n_out) .. ceil((i+1)·n_in/n_out) - 1."""
    m = np.zeros((n_out, n_in), dtype=np.float32)
    for i in range(n_out):
        start, end = (i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)
        m[i, start:end] = 1.0 / (end - start)
    return m


class AdaptiveAvgPool2D(layers.Layer):
    """nn.AdaptiveAvgPool2d(size) for NHWC: identity, a plain average pool, or (for sizes that do
    not divide) two small averaging matrices, as PyTorch computes it. No parameters."""

    def __init__(self, size: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.size = size

    def build(self, input_shape) -> None:
        h, w = int(input_shape[1]), int(input_shape[2])
        self._identity = h == w == self.size
        self._ph = tf.constant(_pool_matrix(h, self.size))
        self._pw = tf.constant(_pool_matrix(w, self.size))
        super().build(input_shape)

    def call(self, x):
        if self._identity:
            return x
        ph, pw = tf.cast(self._ph, x.dtype), tf.cast(self._pw, x.dtype)
        return tf.einsum("ih,nhwc,jw->nijc", ph, x, pw)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.size, self.size, input_shape[3])

    def get_config(self) -> dict:
        return {**super().get_config(), "size": self.size}


# --- seed models -------------------------------------------------------------------------------


@_BUILDERS.builds("seed-small")
def _seed_small(x, num_classes: int):
    x = _max_pool(_relu(_conv(x, 32, 3, padding=1)), 2)
    x = _relu(_dense(layers.Flatten()(x), 64))
    return _dense(x, num_classes)


@_BUILDERS.builds("seed-large")
def _seed_large(x, num_classes: int):
    for width in (128, 256, 512):
        x = _max_pool(_relu(_conv(x, width, 3, padding=1)), 2)
    x = _relu(_dense(layers.Flatten()(x), 512))
    x = _relu(_dense(x, 512))
    return _dense(x, num_classes)


@_BUILDERS.builds("mnist-convnet")
def _mnist_convnet(x, num_classes: int):
    x = _relu(_max_pool(_conv(x, 10, 5), 2))
    x = _relu(_max_pool(layers.SpatialDropout2D(0.5)(_conv(x, 20, 5)), 2))  # nn.Dropout2d
    x = layers.Dropout(0.5)(_relu(_dense(layers.Flatten()(x), 50)))
    return _dense(x, num_classes)


# --- VGG-19 and AlexNet --------------------------------------------------------------------------


@_BUILDERS.builds("vgg19")
def _vgg19(x, num_classes: int):
    for widths in VGG19_STAGES:
        for width in widths:
            x = _relu(_conv(x, width, 3, padding=1, init="he"))
        x = _max_pool(x, 2)
    x = layers.Flatten()(AdaptiveAvgPool2D(7)(x))
    x = layers.Dropout(0.5)(_relu(_dense(x, 4096, init="normal")))
    x = layers.Dropout(0.5)(_relu(_dense(x, 4096, init="normal")))
    return _dense(x, num_classes, init="normal")


@_BUILDERS.builds("alexnet")
def _alexnet(x, num_classes: int):
    x = _max_pool(_relu(_conv(x, 64, 11, stride=4, padding=2)), 3, 2)
    x = _max_pool(_relu(_conv(x, 192, 5, padding=2)), 3, 2)
    x = _relu(_conv(x, 384, 3, padding=1))
    x = _relu(_conv(x, 256, 3, padding=1))
    x = _max_pool(_relu(_conv(x, 256, 3, padding=1)), 3, 2)
    x = layers.Flatten()(AdaptiveAvgPool2D(6)(x))
    x = _relu(_dense(layers.Dropout(0.5)(x), 4096))
    x = _relu(_dense(layers.Dropout(0.5)(x), 4096))
    return _dense(x, num_classes)


# --- ResNet-50 ---------------------------------------------------------------------------------


def _bottleneck(x, width: int, stride: int):
    """ResNet v1.5 bottleneck (stride on the 3x3), as trainscale.models.torch_models.Bottleneck."""
    out_channels = width * 4
    y = _relu(_bn(_conv(x, width, 1, bias=False, init="he")))
    y = _relu(_bn(_conv(y, width, 3, stride=stride, padding=1, bias=False, init="he")))
    y = _bn(_conv(y, out_channels, 1, bias=False, init="he"))
    shortcut = x
    if stride != 1 or x.shape[-1] != out_channels:
        shortcut = _bn(_conv(x, out_channels, 1, stride=stride, bias=False, init="he"))
    return _relu(layers.Add()([y, shortcut]))


@_BUILDERS.builds("resnet50")
def _resnet50(x, num_classes: int):
    x = _relu(_bn(_conv(x, 64, 7, stride=2, padding=3, bias=False, init="he")))
    # nn.MaxPool2d(3, 2, padding=1) pads with -inf; after the ReLU, zeros are the same
    x = _max_pool(layers.ZeroPadding2D(1)(x), 3, 2)
    for width, depth, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(depth):
            x = _bottleneck(x, width, stride if i == 0 else 1)
    return _dense(layers.GlobalAveragePooling2D()(x), num_classes)


# --- GoogLeNet ---------------------------------------------------------------------------------


def _basic_conv(x, filters: int, kernel: int, stride: int = 1, padding: int = 0):
    """GoogLeNet's unit: bias-free conv, BatchNorm(eps=1e-3), ReLU; N(0, 0.01) weights."""
    return _relu(_bn(_conv(x, filters, kernel, stride, padding, bias=False, init="normal"), 1e-3))


def _inception(x, ch1x1, ch3x3_reduce, ch3x3, ch5x5_reduce, ch5x5, pool_proj):
    """1x1 | 1x1->3x3 | 1x1->"5x5" (a 3x3, as torchvision) | 3x3 max pool->1x1, on channels."""
    b1 = _basic_conv(x, ch1x1, 1)
    b2 = _basic_conv(_basic_conv(x, ch3x3_reduce, 1), ch3x3, 3, padding=1)
    b3 = _basic_conv(_basic_conv(x, ch5x5_reduce, 1), ch5x5, 3, padding=1)
    # MaxPool2d(3, 1, padding=1, ceil_mode=True) keeps the size; TF's "same" max pool ignores
    # the padding as PyTorch's -inf does
    b4 = _basic_conv(layers.MaxPooling2D(3, strides=1, padding="same")(x), pool_proj, 1)
    return layers.Concatenate(axis=-1)([b1, b2, b3, b4])


@_BUILDERS.builds("googlenet")
def _googlenet(x, num_classes: int):
    x = _basic_conv(x, 64, 7, stride=2, padding=3)
    x = _ceil_pool(x, 3)
    x = _basic_conv(x, 64, 1)
    x = _basic_conv(x, 192, 3, padding=1)
    x = _ceil_pool(x, 3)
    x = _inception(x, 64, 96, 128, 16, 32, 32)
    x = _inception(x, 128, 128, 192, 32, 96, 64)
    x = _inception(_ceil_pool(x, 3), 192, 96, 208, 16, 48, 64)
    x = _inception(x, 160, 112, 224, 24, 64, 64)
    x = _inception(x, 128, 128, 256, 24, 64, 64)
    x = _inception(x, 112, 144, 288, 32, 64, 64)
    x = _inception(x, 256, 160, 320, 32, 128, 128)
    x = _inception(_ceil_pool(x, 2), 256, 160, 320, 32, 128, 128)
    x = _inception(x, 384, 192, 384, 48, 128, 128)
    x = layers.Dropout(0.2)(layers.GlobalAveragePooling2D()(x))
    return layers.Dense(num_classes, name=_name("dense"), **_normal(0.01, fan_in=x.shape[-1]))(x)


for _gpt_name in (m.name for m in catalog.MODELS.values() if m.gpt):
    _BUILDERS.builds(_gpt_name)(functools.partial(keras_gpt.build, _gpt_name))

_BUILDERS.check_complete()

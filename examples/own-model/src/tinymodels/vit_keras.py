"""The Keras twin of ``tinymodels.vit``: the same ViT in tf-keras 2, parameter for parameter.

trainscale's TensorFlow strategies (tf, tf-mirrored, tf-multiworker, tf-ps) and Horovod-Keras
train a Keras model, so a study that wants them for its model gives a twin under ``keras:``.
The pre-flight compares the two parameter counts (over 1% apart is an error), because a twin
that is a different size would make the frameworks' timings incomparable.

Layer for layer: a ``Conv2D`` of kernel = stride = patch (zero padding at the bottom and right
when a side is not a multiple of the patch, as the PyTorch model pads), a learned position
table, ``depth`` pre-norm blocks (``MultiHeadAttention`` keeps q, k and v as three W×H×(W/H)
kernels with biases where PyTorch keeps one W×3W matrix: the same 3·W² + 3·W parameters), a
GELU MLP of 4·W, LayerNorm (PyTorch's epsilon 1e-5), mean over the tokens and a ``Dense``
head. Given the PyTorch model's weights the two compute the same logits (to float rounding);
each starts from its framework's default initialiser, though, so the counts and shapes are
equal but the two runs do not start from the same numbers.

trainscale passes PyTorch's (C, H, W) ``input_shape`` (as its built-in twins take) and feeds
channels-last images (N, H, W, C).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

# tf.keras is then tf-keras 2, the Keras trainscale runs (set before TensorFlow is imported)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from tf_keras import layers  # noqa: E402


class PositionEmbedding(layers.Layer):
    """Adds a learned (P, W) table to the patch tokens (N, P, W)."""

    def __init__(self, length: int, width: int, **kw) -> None:
        super().__init__(**kw)
        self.length, self.width = length, width

    def build(self, input_shape) -> None:
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.table = self.add_weight("positions", (self.length, self.width), initializer=init)

    def call(self, x):
        return x + tf.cast(self.table, x.dtype)  # cast: bf16/fp16 compute under mixed precision

    def get_config(self) -> dict:
        return {**super().get_config(), "length": self.length, "width": self.width}


def _block(x, width: int, heads: int, n: int):
    """x + attn(norm(x)), then x + mlp(norm(x)): ``tinymodels.transformer.Block``."""
    h = layers.LayerNormalization(epsilon=1e-5, name=f"block_{n}_norm_1")(x)
    attn = layers.MultiHeadAttention(heads, width // heads, name=f"block_{n}_attn")
    x = x + attn(h, h)
    h = layers.LayerNormalization(epsilon=1e-5, name=f"block_{n}_norm_2")(x)
    h = layers.Dense(4 * width, activation="gelu", name=f"block_{n}_fc")(h)
    return x + layers.Dense(width, name=f"block_{n}_proj")(h)


def build(
    *,
    input_shape: Sequence[int],
    classes: int,
    depth: int = 2,
    width: int = 64,
    heads: int = 4,
    patch: int = 4,
) -> keras.Model:
    """The twin of ``tinymodels.vit.build``: (N, H, W, C) float images -> (N, classes) logits.

    Takes the same keywords, ``input_shape`` in PyTorch's (C, H, W) order. The logits are
    float32 even under a mixed-precision policy, so the loss is computed in full precision.
    """
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {tuple(input_shape)}")
    if min(depth, width, heads, patch, classes) < 1:
        raise ValueError("depth, width, heads, patch and classes must be positive")
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")
    channels, height, side = input_shape
    # tinymodels.vit.patch_grid, repeated: importing it would import torch into TensorFlow's
    # processes (and the TensorFlow conda env need not have torch)
    rows, cols = math.ceil(height / patch), math.ceil(side / patch)
    pad_bottom, pad_right = rows * patch - height, cols * patch - side
    images = keras.Input(shape=(height, side, channels), name="images")
    x = images
    if pad_bottom or pad_right:
        x = layers.ZeroPadding2D(((0, pad_bottom), (0, pad_right)), name="pad")(x)
    x = layers.Conv2D(width, patch, strides=patch, name="patch_conv")(x)
    x = layers.Reshape((rows * cols, width), name="tokens")(x)  # row-major, as torch flattens
    x = PositionEmbedding(rows * cols, width, name="positions")(x)
    for n in range(1, depth + 1):
        x = _block(x, width, heads, n)
    x = layers.LayerNormalization(epsilon=1e-5, name="head_norm")(x)
    x = layers.GlobalAveragePooling1D(name="head_pool")(x)
    logits = layers.Dense(classes, name="head_linear")(x)
    if keras.mixed_precision.global_policy().compute_dtype != "float32":
        logits = layers.Activation("linear", dtype="float32", name="logits_fp32")(logits)
    return keras.Model(images, logits, name="tiny_vit")

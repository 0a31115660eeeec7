"""GPT in Keras (tf-keras 2): the twin of trainscale.models.gpt, parameter for parameter.

The same shape: token plus learned position embedding, pre-norm blocks of causal multi-head
attention and a GELU MLP of width 4C, a final LayerNorm and logits through the token
embedding's matrix (tied), no bias anywhere (LayerNormalization without its offset). Keras'
MultiHeadAttention keeps q, k and v as three C×H×Q kernels where PyTorch keeps one C×3C
matrix: the same 3·C² parameters. Initialised as GPT-2 (normal 0.02, the residual
projections 0.02/√(2L)).
"""

from __future__ import annotations

import math
import os

os.environ.setdefault(
    "TF_USE_LEGACY_KERAS", "1"
)  # tf.keras = tf-keras 2 (runners/tensorflow/tf.py)

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from tf_keras import layers  # noqa: E402

from trainscale.plan import catalog  # noqa: E402


class PositionEmbedding(layers.Layer):
    """Adds a learned (context, C) table to the token embeddings (B, T, C)."""

    def __init__(self, context: int, width: int, **kw) -> None:
        super().__init__(**kw)
        self.context, self.width = context, width

    def build(self, input_shape) -> None:
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.table = self.add_weight("positions", (self.context, self.width), initializer=init)

    def call(self, x):
        return x + tf.cast(self.table[: tf.shape(x)[1]], x.dtype)


class TiedHead(layers.Layer):
    """Logits (B, T, V) of the normalised hidden states through the token embedding's matrix;
    the embedding is tracked as a sub-layer, and Keras counts the shared weight once."""

    def __init__(self, embedding: layers.Embedding, **kw) -> None:
        super().__init__(**kw)
        self.embedding = embedding

    def call(self, x):
        return tf.matmul(x, tf.cast(self.embedding.embeddings, x.dtype), transpose_b=True)


def _block(x, heads: int, width: int, residual_std: float, n: int):
    normal = keras.initializers.RandomNormal
    attn = layers.MultiHeadAttention(
        heads, width // heads, use_bias=False, kernel_initializer=normal(stddev=0.02),
        name=f"attn_{n}",
    )  # fmt: skip
    attn._output_dense_kernel_initializer = normal(stddev=residual_std)  # its proj: residual
    h = layers.LayerNormalization(epsilon=1e-5, center=False, name=f"ln_1_{n}")(x)
    x = x + attn(h, h, use_causal_mask=True)
    h = layers.LayerNormalization(epsilon=1e-5, center=False, name=f"ln_2_{n}")(x)
    h = layers.Dense(4 * width, use_bias=False, kernel_initializer=normal(stddev=0.02),
                     name=f"fc_{n}")(h)  # fmt: skip
    h = layers.Activation(lambda z: tf.nn.gelu(z, approximate=True), name=f"gelu_{n}")(h)
    h = layers.Dense(width, use_bias=False, kernel_initializer=normal(stddev=residual_std),
                     name=f"proj_{n}")(h)  # fmt: skip
    return x + h


def build(name: str, context: int, vocab: int) -> keras.Model:
    """GPT `name` for `context` tokens of `vocab` ids: (B, T) int ids -> (B, T, V) logits."""
    n_layers, heads, width = catalog.MODELS[name].gpt
    ids = keras.Input(shape=(context,), dtype="int32", name="tokens")
    tokens = layers.Embedding(
        vocab, width, embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
        name="tokens_embedding",
    )  # fmt: skip
    x = PositionEmbedding(context, width, name="positions")(tokens(ids))
    residual_std = 0.02 / math.sqrt(2 * n_layers)
    for n in range(1, n_layers + 1):
        x = _block(x, heads, width, residual_std, n)
    x = layers.LayerNormalization(epsilon=1e-5, center=False, name="ln_f")(x)
    logits = TiedHead(tokens, name="head")(x)
    if keras.mixed_precision.global_policy().compute_dtype != "float32":
        logits = layers.Activation("linear", dtype="float32", name="logits_fp32")(logits)
    return keras.Model(ids, logits, name=name)

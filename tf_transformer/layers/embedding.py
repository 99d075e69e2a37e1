"""Token embeddings shared with the pre-softmax projection, section 3.4."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops


@keras.saving.register_keras_serializable(package="tf_transformer")
class SharedEmbedding(keras.layers.Layer):
    """An embedding matrix used both ways: ids → vectors and vectors → logits.

    Section 3.4: "we share the same weight matrix between the two embedding
    layers and the pre-softmax linear transformation … In the embedding layers,
    we multiply those weights by √d_model."

    Args:
      vocab_size: number of rows.
      d_model: embedding width.
      scale: multiply looked-up embeddings by √d_model.
      logits_bias: add a learned bias to the logits (not in the paper; Marian's
        models have one).
      zero_ids: ids that embed to the zero vector whatever their row holds
        (Marian starts the decoder from zeros: the import makes BOS one).

    Call args:
      x: ``int[batch, len]`` ids, or ``[..., d_model]`` (any leading shape) when ``reverse``.
      reverse: project onto the vocabulary (x Eᵀ) instead of looking up.

    Returns:
      ``[batch, len, d_model]`` embeddings, or ``[..., vocab_size]`` float32
      logits when ``reverse``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        scale: bool = True,
        logits_bias: bool = False,
        zero_ids: tuple[int, ...] = (),
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = scale
        self.use_logits_bias = logits_bias
        self.zero_ids = tuple(zero_ids)

    def build(self, x_shape=None):
        # N(0, d_model^-0.5): after the √d_model scale the embeddings have unit
        # variance, and as the output projection the logits start near zero.
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        )
        self.logits_bias = (
            self.add_weight(name="logits_bias", shape=(self.vocab_size,), initializer="zeros")
            if self.use_logits_bias
            else None
        )

    def call(self, x, reverse=False):
        if reverse:
            kernel = ops.cast(self.embeddings, self.compute_dtype)  # [vocab, d_model]
            rows = ops.reshape(x, (-1, self.d_model))  # [rows, d_model]
            # x Eᵀ as one 2-D matmul with a transposed operand: transposing E
            # itself copies the whole [vocab, d_model] matrix on every call.
            logits = tf.linalg.matmul(rows, kernel, transpose_b=True)  # [rows, vocab]
            logits = tf.reshape(logits, tf.concat([tf.shape(x)[:-1], [self.vocab_size]], axis=0))  # [..., vocab]
            logits = ops.cast(logits, "float32")
            if self.logits_bias is not None:
                logits = logits + ops.cast(self.logits_bias, "float32")  # [..., vocab]
            return logits
        ids = ops.cast(x, "int32")  # [batch, len]
        x = ops.take(self.embeddings, ids, axis=0)  # [batch, len, d_model]
        x = ops.cast(x, self.compute_dtype)
        if self.zero_ids:
            kept = ops.all(ops.stack([ids != i for i in self.zero_ids]), axis=0)  # [batch, len]
            x = x * ops.cast(kept, self.compute_dtype)[..., None]
        if self.scale:
            x = x * ops.cast(self.d_model**0.5, self.compute_dtype)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            scale=self.scale,
            logits_bias=self.use_logits_bias,
            zero_ids=list(self.zero_ids),
        )
        return config

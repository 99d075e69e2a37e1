"""Positional information: sinusoids (section 3.5) or learned embeddings (Table 3 row E)."""

from __future__ import annotations

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="tf_transformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(…), section 3.5.

    Even channels hold sines and odd channels cosines, as in the paper's formula.
    Has no weights; any length works (the paper's reason for choosing sinusoids).

    Args:
      max_wavelength: the 10000 of the formula.

    Call args:
      x: ``[batch, len, d_model]``; only its length and width are used.
      start_index: position of ``x[:, 0]`` (non-zero during incremental decoding).

    Returns:
      ``[len, d_model]`` encodings in the compute dtype, to be added to ``x``.
    """

    def __init__(self, max_wavelength: float = 10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength

    def call(self, x, start_index=0):
        length, d_model = ops.shape(x)[1], ops.shape(x)[2]
        positions = ops.cast(ops.arange(length) + start_index, "float32")  # [len]
        channel = ops.cast(ops.arange(d_model) // 2 * 2, "float32")  # [d_model]: 2i for 2i and 2i+1
        inv_freq = ops.exp(-math.log(self.max_wavelength) * channel / ops.cast(d_model, "float32"))
        angles = positions[:, None] * inv_freq[None, :]  # [len, d_model]
        is_even = ops.arange(d_model) % 2 == 0  # [d_model]
        encoding = ops.where(is_even[None, :], ops.sin(angles), ops.cos(angles))  # [len, d_model]
        return ops.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, x_shape):
        return (x_shape[1], x_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class LearnedPositionEmbedding(keras.layers.Layer):
    """One trained vector per position, Table 3 row (E) (after Gehring et al., 2017).

    Args:
      max_positions: number of positions; longer inputs are an error.
      initializer: initializer of the ``[max_positions, d_model]`` table.

    Call args:
      x: ``[batch, len, d_model]``; only its length is used.
      start_index: position of ``x[:, 0]``.

    Returns:
      ``[len, d_model]`` embeddings to be added to ``x``.
    """

    def __init__(self, max_positions: int, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_positions = max_positions
        self.initializer = keras.initializers.get(initializer)

    def build(self, x_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings", shape=(self.max_positions, x_shape[-1]), initializer=self.initializer
        )

    def call(self, x, start_index=0):
        length = ops.shape(x)[1]
        return ops.slice(self.position_embeddings, (start_index, 0), (length, ops.shape(x)[2]))  # [len, d_model]

    def compute_output_shape(self, x_shape):
        return (x_shape[1], x_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(max_positions=self.max_positions, initializer=keras.initializers.serialize(self.initializer))
        return config

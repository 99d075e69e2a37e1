"""Position-wise feed-forward network, eq. 2 of section 3.3."""

from __future__ import annotations

import keras

from tf_transformer.layers.decoding_kernels import decoding_kernel, feed_forward_transposed, project


@keras.saving.register_keras_serializable(package="tf_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position identically.

    Args:
      d_ff: inner width (2048 in the base model).
      output_dim: output width (``None`` → the input's last dimension, d_model).
      relu_dropout: dropout after the ReLU (not in the paper: 0).
      activation: the inner activation (the paper's ReLU by default).

    Call args:
      x: ``[batch, len, d_model]``.

    Returns:
      ``[batch, len, output_dim]``.
    """

    def __init__(
        self,
        d_ff: int,
        output_dim: int | None = None,
        relu_dropout: float = 0.0,
        activation: str = "relu",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_ff = d_ff
        self.output_dim = output_dim
        self.relu_dropout = relu_dropout
        self.activation = activation
        self.inner = keras.layers.Dense(d_ff, activation=activation, dtype=self.dtype_policy, name="inner")
        self.inner_dropout = keras.layers.Dropout(relu_dropout, dtype=self.dtype_policy, name="inner_dropout")
        self.outer = None  # created in build(): its width defaults to the input's

    def build(self, x_shape):
        self.inner.build(x_shape)
        output_dim = self.output_dim if self.output_dim is not None else x_shape[-1]
        self.outer = keras.layers.Dense(output_dim, dtype=self.dtype_policy, name="outer")
        self.outer.build(tuple(x_shape[:-1]) + (self.d_ff,))

    def call(self, x, training=None):
        hidden = self.inner(x)  # [batch, len, d_ff]
        hidden = self.inner_dropout(hidden, training=training)
        return self.outer(hidden)  # [batch, len, output_dim]

    def decoding_weights(self) -> dict:
        """W1, b1, W2, b2 laid out for :meth:`decode_rows`, prepared once per search.

        Stored transposed or not as these few-row products multiply faster on
        this CPU (:func:`~tf_transformer.layers.decoding_kernels.feed_forward_transposed`).
        """
        transpose = feed_forward_transposed(self.compute_dtype)
        return {
            "inner": decoding_kernel([self.inner], self.compute_dtype, transpose=transpose),
            "outer": decoding_kernel([self.outer], self.compute_dtype, transpose=transpose),
        }

    def decode_rows(self, rows, weights):
        """FFN of ``rows`` ``[n, d_model]`` with :meth:`decoding_weights` (inference: no dropout)."""
        hidden = self.inner.activation(project(rows, weights["inner"]))  # [n, d_ff]
        return project(hidden, weights["outer"])  # [n, output_dim]

    def compute_output_shape(self, x_shape):
        output_dim = self.output_dim if self.output_dim is not None else x_shape[-1]
        return tuple(x_shape[:-1]) + (output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            d_ff=self.d_ff,
            output_dim=self.output_dim,
            relu_dropout=self.relu_dropout,
            activation=self.activation,
        )
        return config

"""Position-wise feed-forward network, eq. 2 of section 3.3."""

from __future__ import annotations

import keras


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

    Inference interface: the ``Dense`` layers ``inner`` (W1, b1 and the
    activation) and ``outer`` (W2, b2).
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

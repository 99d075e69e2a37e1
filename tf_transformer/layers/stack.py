"""What the encoder and decoder stacks share (section 3.1): positions, dropout, N layers, hyper-parameters."""

from __future__ import annotations

import keras

from tf_transformer.layers.normalization import LayerNormalization
from tf_transformer.layers.position import LearnedPositionEmbedding, SinusoidalPositionEncoding


def layer_hyperparameters(layer) -> dict:
    """The hyper-parameters shared by encoder and decoder layers, for get_config."""
    return dict(
        num_heads=layer.num_heads,
        key_dim=layer.key_dim,
        value_dim=layer.value_dim,
        d_ff=layer.d_ff,
        dropout=layer.dropout,
        attention_dropout=layer.attention_dropout,
        relu_dropout=layer.relu_dropout,
        pre_norm=layer.pre_norm,
        layer_norm_epsilon=layer.layer_norm_epsilon,
        attention_bias=layer.attention_bias,
        activation=layer.activation,
    )


def make_position_layer(
    position: str,
    max_positions: int,
    dtype,
    name: str = "position",
    layout: str = "interleaved",
    timescales: str = "paper",
):
    """The position layer for ``position`` = ``"sinusoidal"`` (of ``layout`` and ``timescales``, see
    :class:`SinusoidalPositionEncoding`) | ``"learned"``."""
    if position == "sinusoidal":
        return SinusoidalPositionEncoding(layout=layout, timescales=timescales, dtype=dtype, name=name)
    if position == "learned":
        return LearnedPositionEmbedding(max_positions, dtype=dtype, name=name)
    raise ValueError(f"position must be 'sinusoidal' or 'learned', got {position!r}")


class LayerStack(keras.layers.Layer):
    """What the encoder and decoder stacks share (section 3.1): positions added to
    the scaled embeddings, dropout on their sum (5.4), N identical layers, and with
    ``pre_norm`` a final LayerNormalization.

    Subclasses name the layer class (``layer_class``) and the attribute holding the
    list of layers (``layers_attribute``: ``encoder_layers``, ``decoder_layers``).

    Inference interface: ``position_layer``, the list of layers, the hyper-parameters
    (``num_heads``, ``key_dim``, ``value_dim``) and :meth:`finish`.
    """

    layer_class: type[keras.layers.Layer]
    layers_attribute: str

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        key_dim: int,
        value_dim: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        relu_dropout: float = 0.0,
        pre_norm: bool = False,
        layer_norm_epsilon: float = 1e-6,
        attention_bias: bool = False,
        position: str = "sinusoidal",
        max_positions: int = 1024,
        activation: str = "relu",
        position_layout: str = "interleaved",
        position_timescales: str = "paper",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.pre_norm = pre_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention_bias = attention_bias
        self.position = position
        self.max_positions = max_positions
        self.activation = activation
        self.position_layout = position_layout
        self.position_timescales = position_timescales
        self.position_layer = make_position_layer(
            position, max_positions, self.dtype_policy, layout=position_layout, timescales=position_timescales
        )
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="embedding_dropout")
        layers = [
            self.layer_class(**layer_hyperparameters(self), dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(num_layers)
        ]
        setattr(self, self.layers_attribute, layers)
        self.final_norm = (
            LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm")
            if pre_norm
            else None
        )
        # Also one attribute per layer: TensorFlow checkpoints (tf.train.Checkpoint)
        # do not see into Keras' tracked lists, and training checkpoints use them.
        for index, layer in enumerate(layers):
            setattr(self, f"layer_{index}", layer)

    def finish(self, x):
        """The stack's output from the last layer's: with ``pre_norm`` the final LayerNormalization."""
        return x if self.final_norm is None else self.final_norm(x)

    def get_config(self):
        config = super().get_config()
        config.update(
            layer_hyperparameters(self),
            num_layers=self.num_layers,
            position=self.position,
            max_positions=self.max_positions,
            position_layout=self.position_layout,
            position_timescales=self.position_timescales,
        )
        return config

"""What the encoder and decoder share (section 3.1): their layers' hyper-parameters and sub-layers, and
the stacks' positions, dropout and N layers."""

from __future__ import annotations

import keras

from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.feed_forward import PositionwiseFeedForward
from tf_transformer.layers.normalization import LayerNormalization
from tf_transformer.layers.position import LearnedPositionEmbedding, SinusoidalPositionEncoding
from tf_transformer.layers.residual import ResidualSublayer

# The hyper-parameters of an encoder or decoder layer, in their constructors' order.
LAYER_HYPERPARAMETERS = (
    "num_heads",
    "key_dim",
    "value_dim",
    "d_ff",
    "dropout",
    "attention_dropout",
    "relu_dropout",
    "pre_norm",
    "layer_norm_epsilon",
    "attention_bias",
    "activation",
)


def layer_hyperparameters(layer) -> dict:
    """The hyper-parameters shared by encoder and decoder layers (and held by their stacks), for get_config."""
    return {name: getattr(layer, name) for name in LAYER_HYPERPARAMETERS}


class TransformerLayer(keras.layers.Layer):
    """What an encoder and a decoder layer share (section 3.1): their hyper-parameters, and how each
    builds its multi-head attentions, its FFN and the residual wrapper around each sub-layer.

    Args:
      num_heads, key_dim, value_dim: the attention's h, d_k, d_v.
      d_ff: the FFN's inner width.
      dropout: residual dropout P_drop (section 5.4).
      attention_dropout, relu_dropout: optional extra dropouts (0 in the paper).
      pre_norm: pre-LN instead of the paper's post-LN.
      layer_norm_epsilon: LayerNormalization epsilon.
      attention_bias: biases in the attention projections (none in the paper).
      activation: the FFN's inner activation (the paper's ReLU; Marian's models use swish).
    """

    def __init__(
        self,
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
        activation: str = "relu",
        **kwargs,
    ):
        super().__init__(**kwargs)
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
        self.activation = activation

    def make_attention(self, name: str) -> MultiHeadAttention:
        return MultiHeadAttention(
            self.num_heads,
            self.key_dim,
            self.value_dim,
            dropout=self.attention_dropout,
            use_bias=self.attention_bias,
            dtype=self.dtype_policy,
            name=name,
        )

    def make_feed_forward(self, name: str = "feed_forward") -> PositionwiseFeedForward:
        return PositionwiseFeedForward(
            self.d_ff, relu_dropout=self.relu_dropout, activation=self.activation, dtype=self.dtype_policy, name=name
        )

    def make_residual(self, name: str) -> ResidualSublayer:
        return ResidualSublayer(
            dropout=self.dropout,
            pre_norm=self.pre_norm,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy,
            name=name,
        )

    def get_config(self):
        config = super().get_config()
        config.update(layer_hyperparameters(self))
        return config


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

    Args:
      num_layers: N.
      position: ``"sinusoidal"`` or ``"learned"``; ``max_positions`` bounds the latter.
      position_layout, position_timescales: the sinusoids' (:class:`SinusoidalPositionEncoding`).
      Keyword arguments named in :data:`LAYER_HYPERPARAMETERS` go to each layer
      (:class:`TransformerLayer`); the stack holds their values too.

    Inference interface: ``position_layer``, the list of layers, the hyper-parameters
    (``num_heads``, ``key_dim``, ``value_dim``) and :meth:`finish`.
    """

    layer_class: type[keras.layers.Layer]
    layers_attribute: str

    def __init__(
        self,
        num_layers: int,
        position: str = "sinusoidal",
        max_positions: int = 1024,
        position_layout: str = "interleaved",
        position_timescales: str = "paper",
        **kwargs,
    ):
        # The layers' hyper-parameters (LAYER_HYPERPARAMETERS) go to each layer; the stack reads them back.
        layer_arguments = {name: kwargs.pop(name) for name in LAYER_HYPERPARAMETERS if name in kwargs}
        super().__init__(**kwargs)
        if num_layers < 1:
            raise ValueError(f"{self.name}: num_layers must be positive, got {num_layers}")
        self.num_layers = num_layers
        self.position = position
        self.max_positions = max_positions
        self.position_layout = position_layout
        self.position_timescales = position_timescales
        self.position_layer = make_position_layer(
            position, max_positions, self.dtype_policy, layout=position_layout, timescales=position_timescales
        )
        layers = [
            self.layer_class(**layer_arguments, dtype=self.dtype_policy, name=f"layer_{i}") for i in range(num_layers)
        ]
        for name, value in layer_hyperparameters(layers[0]).items():
            setattr(self, name, value)
        setattr(self, self.layers_attribute, layers)
        self.embedding_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="embedding_dropout")
        self.final_norm = (
            LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm")
            if self.pre_norm
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

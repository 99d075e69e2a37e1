"""Encoder layer and encoder stack, section 3.1."""

from __future__ import annotations

import keras

from tf_transformer import masks
from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.feed_forward import PositionwiseFeedForward
from tf_transformer.layers.normalization import LayerNormalization
from tf_transformer.layers.position import LearnedPositionEmbedding, SinusoidalPositionEncoding


@keras.saving.register_keras_serializable(package="tf_transformer")
class ResidualSublayer(keras.layers.Layer):
    """Dropout, residual and LayerNorm around one sub-layer (sections 3.1 and 5.4).

    Post-LN (the paper): ``LayerNorm(x + Dropout(Sublayer(x)))``.
    Pre-LN (``pre_norm=True``): ``x + Dropout(Sublayer(LayerNorm(x)))``.
    The sub-layer itself is passed to ``call`` as a function of the
    normalized-or-not input, so this layer owns only the norm and dropout.
    """

    def __init__(self, dropout: float = 0.1, pre_norm: bool = False, layer_norm_epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.pre_norm = pre_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="norm")
        self.residual_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, x_shape):
        self.norm.build(x_shape)

    def call(self, x, sublayer, training=None):
        if self.pre_norm:
            return x + self.residual_dropout(sublayer(self.norm(x)), training=training)
        return self.norm(x + self.residual_dropout(sublayer(x), training=training))

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, pre_norm=self.pre_norm, layer_norm_epsilon=self.layer_norm_epsilon)
        return config


def _layer_kwargs(layer):
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
    )


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(keras.layers.Layer):
    """Self-attention then a position-wise FFN, each wrapped residually (section 3.1).

    Args:
      num_heads, key_dim, value_dim: the attention's h, d_k, d_v.
      d_ff: the FFN's inner width.
      dropout: residual dropout P_drop (section 5.4).
      attention_dropout, relu_dropout: optional extra dropouts (0 in the paper).
      pre_norm: pre-LN instead of the paper's post-LN.
      layer_norm_epsilon: LayerNormalization epsilon.

    Call args:
      x: ``[batch, src_len, d_model]``.
      attention_mask: ``[batch, 1, 1, src_len]`` boolean padding mask.

    Returns:
      ``[batch, src_len, d_model]``.
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
        residual = dict(dropout=dropout, pre_norm=pre_norm, layer_norm_epsilon=layer_norm_epsilon)
        self.self_attention = MultiHeadAttention(
            num_heads,
            key_dim,
            value_dim,
            dropout=attention_dropout,
            use_bias=attention_bias,
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.self_attention_residual = ResidualSublayer(
            **residual, dtype=self.dtype_policy, name="self_attention_residual"
        )
        self.feed_forward = PositionwiseFeedForward(
            d_ff, relu_dropout=relu_dropout, dtype=self.dtype_policy, name="feed_forward"
        )
        self.feed_forward_residual = ResidualSublayer(**residual, dtype=self.dtype_policy, name="feed_forward_residual")

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_residual.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_residual.build(x_shape)

    def call(self, x, attention_mask=None, training=None):
        x = self.self_attention_residual(
            x,
            sublayer=lambda h: self.self_attention(h, h, attention_mask=attention_mask, training=training),
            training=training,
        )  # [batch, src_len, d_model]
        return self.feed_forward_residual(
            x, sublayer=lambda h: self.feed_forward(h, training=training), training=training
        )  # [batch, src_len, d_model]

    def encode_tokens(self, rows, tokens, attention_mask):
        """:meth:`call` on the real tokens' rows ``[n, d_model]`` (inference; see :meth:`Encoder.encode_tokens`)."""
        x = self.self_attention_residual(
            rows,
            sublayer=lambda h: self.self_attention.attend_tokens(h, tokens, attention_mask),
            training=False,
        )  # [n, d_model]
        return self.feed_forward_residual(
            x, sublayer=lambda h: self.feed_forward(h, training=False), training=False
        )  # [n, d_model]

    def compute_output_shape(self, x_shape):
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(_layer_kwargs(self))
        return config


def make_position_layer(position: str, max_length: int, dtype, name: str = "position"):
    """The position layer for ``position`` = ``"sinusoidal"`` | ``"learned"``."""
    if position == "sinusoidal":
        return SinusoidalPositionEncoding(dtype=dtype, name=name)
    if position == "learned":
        return LearnedPositionEmbedding(max_length, dtype=dtype, name=name)
    raise ValueError(f"position must be 'sinusoidal' or 'learned', got {position!r}")


class LayerStack(keras.layers.Layer):
    """What the encoder and decoder stacks share (section 3.1): positions added to
    the scaled embeddings, dropout on their sum (5.4), N identical layers, and with
    ``pre_norm`` a final LayerNormalization.

    Subclasses name the layer class (``layer_class``) and the attribute holding the
    list of layers (``layers_attribute``).
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
        max_length: int = 1024,
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
        self.max_length = max_length
        self.position_layer = make_position_layer(position, max_length, self.dtype_policy)
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="embedding_dropout")
        layers = [
            self.layer_class(**_layer_kwargs(self), dtype=self.dtype_policy, name=f"layer_{i}")
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

    def _finish(self, x):
        return x if self.final_norm is None else self.final_norm(x)

    def get_config(self):
        config = super().get_config()
        config.update(
            _layer_kwargs(self),
            num_layers=self.num_layers,
            position=self.position,
            max_length=self.max_length,
        )
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(LayerStack):
    """The encoder stack: positions, dropout, then N encoder layers (section 3.1).

    Takes the already scaled token embeddings (the embedding matrix is shared
    with the decoder, so the model owns it). With ``pre_norm`` a final
    LayerNormalization closes the stack, as every pre-LN implementation does.

    Args:
      num_layers: N.
      position: ``"sinusoidal"`` or ``"learned"``; max_length bounds the latter.
      (other args as :class:`EncoderLayer`)

    Call args:
      embedded: ``[batch, src_len, d_model]`` scaled token embeddings.
      padding_mask: ``[batch, 1, 1, src_len]`` boolean.

    Returns:
      ``[batch, src_len, d_model]`` encoder output (the decoder's memory).
    """

    layer_class = EncoderLayer
    layers_attribute = "encoder_layers"

    def build(self, embedded_shape):
        self.position_layer.build(embedded_shape)
        for layer in self.encoder_layers:
            layer.build(embedded_shape)
        if self.final_norm is not None:
            self.final_norm.build(embedded_shape)

    def call(self, embedded, padding_mask=None, training=None):
        x = embedded + self.position_layer(embedded)[None]  # [batch, src_len, d_model]
        x = self.embedding_dropout(x, training=training)
        for layer in self.encoder_layers:
            x = layer(x, attention_mask=padding_mask, training=training)  # [batch, src_len, d_model]
        return self._finish(x)

    def encode_tokens(self, embedded, padding_mask):
        """:meth:`call` for inference with the position-wise work done on the real tokens only.

        A batch padded to its longest sentence is largely padding (newstest2013
        in batches of 32: 43 % real tokens). The projections, FFNs and norms run
        on the real tokens' rows; only eq. 1 sees the padded batch. Returns
        ``[batch, src_len, d_model]``: the real positions as :meth:`call` computes
        them, zeros at padding (which every attention over the memory masks).
        """
        tokens = masks.TokenPacking(padding_mask[:, 0, 0, :])
        x = tokens.take(embedded + self.position_layer(embedded)[None])  # [n, d_model]
        for layer in self.encoder_layers:
            x = layer.encode_tokens(x, tokens, padding_mask)  # [n, d_model]
        return tokens.pad(self._finish(x))  # [batch, src_len, d_model]

    def compute_output_shape(self, embedded_shape):
        return embedded_shape

"""Decoder layer and decoder stack, section 3.1."""

from __future__ import annotations

import keras
from keras import ops

from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.encoder import LayerStack, ResidualSublayer, _layer_kwargs
from tf_transformer.layers.feed_forward import PositionwiseFeedForward


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(keras.layers.Layer):
    """Masked self-attention, encoder-decoder attention, FFN (section 3.1).

    "In addition to the two sub-layers in each encoder layer, the decoder inserts
    a third sub-layer, which performs multi-head attention over the output of the
    encoder stack." Each sub-layer is wrapped residually as in the encoder.

    Args: as :class:`~tf_transformer.layers.encoder.EncoderLayer`.

    Call args:
      x: ``[batch, tgt_len, d_model]``.
      memory: ``[batch, src_len, d_model]`` encoder output.
      self_attention_mask: ``[batch, 1, tgt_len, tgt_len]`` (causal and padding).
      memory_mask: ``[batch, 1, 1, src_len]`` source padding mask.

    Returns:
      ``[batch, tgt_len, d_model]``.
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
        policy = self.dtype_policy
        self.self_attention = MultiHeadAttention(
            num_heads,
            key_dim,
            value_dim,
            dropout=attention_dropout,
            use_bias=attention_bias,
            dtype=policy,
            name="self_attention",
        )
        self.self_attention_residual = ResidualSublayer(**residual, dtype=policy, name="self_attention_residual")
        self.cross_attention = MultiHeadAttention(
            num_heads,
            key_dim,
            value_dim,
            dropout=attention_dropout,
            use_bias=attention_bias,
            dtype=policy,
            name="cross_attention",
        )
        self.cross_attention_residual = ResidualSublayer(**residual, dtype=policy, name="cross_attention_residual")
        self.feed_forward = PositionwiseFeedForward(d_ff, relu_dropout=relu_dropout, dtype=policy, name="feed_forward")
        self.feed_forward_residual = ResidualSublayer(**residual, dtype=policy, name="feed_forward_residual")

    def build(self, x_shape, memory_shape):
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_residual.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        self.cross_attention_residual.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_residual.build(x_shape)

    def call(self, x, memory, self_attention_mask=None, memory_mask=None, training=None):
        x = self.self_attention_residual(
            x,
            sublayer=lambda h: self.self_attention(h, h, attention_mask=self_attention_mask, training=training),
            training=training,
        )  # [batch, tgt_len, d_model]
        x = self.cross_attention_residual(
            x,
            sublayer=lambda h: self.cross_attention(h, memory, attention_mask=memory_mask, training=training),
            training=training,
        )  # [batch, tgt_len, d_model]
        return self.feed_forward_residual(
            x, sublayer=lambda h: self.feed_forward(h, training=training), training=training
        )  # [batch, tgt_len, d_model]

    def compute_output_shape(self, x_shape, memory_shape):
        return x_shape

    def decode_step(self, x, cache, memory_key_value, memory_mask, step):
        """One incremental step (inference): ``x`` is ``[batch, 1, d_model]`` at position ``step``.

        ``cache`` holds this layer's self-attention keys and values, fixed-shape
        ``[batch, heads, max_len, d_k]``/``[…, d_v]``; the new token's are written
        at ``step``. ``memory_key_value`` are the encoder-decoder keys and values,
        computed once per sentence. Returns ``(output [batch, 1, d_model], cache)``.
        """
        max_len = ops.shape(cache["key"])[2]
        visible = (ops.arange(max_len) <= step)[None, None, None, :]  # [1, 1, 1, max_len]
        updated = {}

        def self_attend(h):
            key, value = self.self_attention.project_key_value(h)  # [batch, heads, 1, d_k], [.., d_v]
            updated["key"] = ops.slice_update(cache["key"], (0, 0, step, 0), ops.cast(key, cache["key"].dtype))
            updated["value"] = ops.slice_update(cache["value"], (0, 0, step, 0), ops.cast(value, cache["value"].dtype))
            return self.self_attention.attend(h, updated["key"], updated["value"], visible)

        x = self.self_attention_residual(x, sublayer=self_attend, training=False)
        memory_key, memory_value = memory_key_value
        x = self.cross_attention_residual(
            x,
            sublayer=lambda h: self.cross_attention.attend(h, memory_key, memory_value, memory_mask),
            training=False,
        )
        x = self.feed_forward_residual(x, sublayer=lambda h: self.feed_forward(h, training=False), training=False)
        return x, updated

    def get_config(self):
        config = super().get_config()
        config.update(_layer_kwargs(self))
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
    """The decoder stack: positions, dropout, then N decoder layers (section 3.1).

    Takes the scaled target embeddings (shifted right: BOS first) and returns
    the final hidden states; the model projects them with the shared embedding.

    Args: as :class:`~tf_transformer.layers.encoder.Encoder`.

    Call args:
      embedded: ``[batch, tgt_len, d_model]``.
      memory: ``[batch, src_len, d_model]`` encoder output.
      self_attention_mask: ``[batch, 1, tgt_len, tgt_len]``.
      memory_mask: ``[batch, 1, 1, src_len]``.

    Returns:
      ``[batch, tgt_len, d_model]``.
    """

    layer_class = DecoderLayer
    layers_attribute = "decoder_layers"

    def build(self, embedded_shape, memory_shape):
        self.position_layer.build(embedded_shape)
        for layer in self.decoder_layers:
            layer.build(embedded_shape, memory_shape)
        if self.final_norm is not None:
            self.final_norm.build(embedded_shape)

    def call(self, embedded, memory, self_attention_mask=None, memory_mask=None, training=None):
        x = embedded + self.position_layer(embedded)[None]  # [batch, tgt_len, d_model]
        x = self.embedding_dropout(x, training=training)
        for layer in self.decoder_layers:
            x = layer(
                x, memory, self_attention_mask=self_attention_mask, memory_mask=memory_mask, training=training
            )  # [batch, tgt_len, d_model]
        return self._finish(x)

    def compute_output_shape(self, embedded_shape, memory_shape):
        return embedded_shape

    def memory_key_values(self, memory):
        """Every layer's encoder-decoder keys and values, computed once per sentence."""
        return [layer.cross_attention.project_key_value(memory) for layer in self.decoder_layers]

    def empty_cache(self, batch, max_length, dtype):
        """Zeroed fixed-shape self-attention caches, one ``{"key", "value"}`` per layer."""
        return [
            {
                "key": ops.zeros((batch, self.num_heads, max_length, self.key_dim), dtype),
                "value": ops.zeros((batch, self.num_heads, max_length, self.value_dim), dtype),
            }
            for _ in self.decoder_layers
        ]

    def decode_step(self, embedded, caches, memory_key_values, memory_mask, step):
        """``embedded`` ``[batch, 1, d_model]`` at position ``step`` → ``([batch, 1, d_model], caches)``."""
        x = embedded + self.position_layer(embedded, start_index=step)[None]  # [batch, 1, d_model]
        new_caches = []
        for layer, cache, key_value in zip(self.decoder_layers, caches, memory_key_values, strict=True):
            x, cache = layer.decode_step(x, cache, key_value, memory_mask, step)
            new_caches.append(cache)
        return self._finish(x), new_caches

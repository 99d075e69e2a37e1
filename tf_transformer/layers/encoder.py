"""Encoder layer and encoder stack, section 3.1."""

from __future__ import annotations

import keras

from tf_transformer.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(TransformerLayer):
    """Self-attention then a position-wise FFN, each wrapped residually (section 3.1).

    Args: as :class:`~tf_transformer.layers.stack.TransformerLayer`.

    Call args:
      x: ``[batch, src_len, d_model]``.
      attention_mask: ``[batch, 1, 1, src_len]`` boolean padding mask.

      return_attention_scores: also return ``{"self_attention": [batch, heads,
        src_len, src_len]}``, the attention weights the layer used.

    Returns:
      ``[batch, src_len, d_model]`` (and the weights when asked).

    Inference interface: the sub-layers ``self_attention``, ``feed_forward`` and
    their ``ResidualSublayer`` wrappers ``self_attention_residual``,
    ``feed_forward_residual``.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.self_attention = self.make_attention("self_attention")
        self.self_attention_residual = self.make_residual("self_attention_residual")
        self.feed_forward = self.make_feed_forward()
        self.feed_forward_residual = self.make_residual("feed_forward_residual")

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_residual.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_residual.build(x_shape)

    def call(self, x, attention_mask=None, training=None, return_attention_scores=False):
        def self_attend(h):
            return self.self_attention(
                h, h, attention_mask=attention_mask, training=training, return_attention_scores=return_attention_scores
            )

        x = self.self_attention_residual(x, sublayer=self_attend, training=training)  # [batch, src_len, d_model]
        if return_attention_scores:
            x, weights = x  # weights: [batch, heads, src_len, src_len]
        x = self.feed_forward_residual(
            x, sublayer=lambda h: self.feed_forward(h, training=training), training=training
        )  # [batch, src_len, d_model]
        return (x, {"self_attention": weights}) if return_attention_scores else x

    def compute_output_shape(self, x_shape):
        return x_shape


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(LayerStack):
    """The encoder stack: positions, dropout, then N encoder layers (section 3.1).

    Takes the already scaled token embeddings (the embedding matrix is shared
    with the decoder, so the model owns it). With ``pre_norm`` a final
    LayerNormalization closes the stack, as every pre-LN implementation does.

    Args: as :class:`~tf_transformer.layers.stack.LayerStack`.

    Call args:
      embedded: ``[batch, src_len, d_model]`` scaled token embeddings.
      padding_mask: ``[batch, 1, 1, src_len]`` boolean.

      return_attention_scores: also return one dict of attention weights per
        layer (see :class:`EncoderLayer`).

    Returns:
      ``[batch, src_len, d_model]`` encoder output (the decoder's memory), and
      the weights when asked.
    """

    layer_class = EncoderLayer
    layers_attribute = "encoder_layers"

    def build(self, embedded_shape):
        self.position_layer.build(embedded_shape)
        for layer in self.encoder_layers:
            layer.build(embedded_shape)
        if self.final_norm is not None:
            self.final_norm.build(embedded_shape)

    def call(self, embedded, padding_mask=None, training=None, return_attention_scores=False):
        x = embedded + self.position_layer(embedded)[None]  # [batch, src_len, d_model]
        x = self.embedding_dropout(x, training=training)
        scores = []
        for layer in self.encoder_layers:
            x = layer(
                x, attention_mask=padding_mask, training=training, return_attention_scores=return_attention_scores
            )  # [batch, src_len, d_model]
            if return_attention_scores:
                x, weights = x
                scores.append(weights)
        return (self.finish(x), scores) if return_attention_scores else self.finish(x)

    def compute_output_shape(self, embedded_shape):
        return embedded_shape

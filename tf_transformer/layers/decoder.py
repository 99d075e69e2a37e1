"""Decoder layer and decoder stack, section 3.1."""

from __future__ import annotations

import keras

from tf_transformer.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(TransformerLayer):
    """Masked self-attention, encoder-decoder attention, FFN (section 3.1).

    "In addition to the two sub-layers in each encoder layer, the decoder inserts
    a third sub-layer, which performs multi-head attention over the output of the
    encoder stack." Each sub-layer is wrapped residually as in the encoder.

    Args: as :class:`~tf_transformer.layers.stack.TransformerLayer`.

    Call args:
      x: ``[batch, tgt_len, d_model]``.
      memory: ``[batch, src_len, d_model]`` encoder output.
      self_attention_mask: ``[batch, 1, tgt_len, tgt_len]`` (causal and padding).
      memory_mask: ``[batch, 1, 1, src_len]`` source padding mask.

      return_attention_scores: also return ``{"self_attention": [batch, heads,
        tgt_len, tgt_len], "cross_attention": [batch, heads, tgt_len, src_len]}``,
        the attention weights the layer used.

    Returns:
      ``[batch, tgt_len, d_model]`` (and the weights when asked).

    Inference interface: the sub-layers ``self_attention``, ``cross_attention``,
    ``feed_forward`` and their ``ResidualSublayer`` wrappers
    (``self_attention_residual``, ``cross_attention_residual``,
    ``feed_forward_residual``).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.self_attention = self.make_attention("self_attention")
        self.self_attention_residual = self.make_residual("self_attention_residual")
        self.cross_attention = self.make_attention("cross_attention")
        self.cross_attention_residual = self.make_residual("cross_attention_residual")
        self.feed_forward = self.make_feed_forward()
        self.feed_forward_residual = self.make_residual("feed_forward_residual")

    def build(self, x_shape, memory_shape):
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_residual.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        self.cross_attention_residual.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_residual.build(x_shape)

    def call(self, x, memory, self_attention_mask=None, memory_mask=None, training=None, return_attention_scores=False):
        scores = {}

        def attend(name, attention, residual, x, keys, mask):
            x = residual(
                x,
                sublayer=lambda h: attention(
                    h, keys(h), attention_mask=mask, training=training, return_attention_scores=return_attention_scores
                ),
                training=training,
            )
            if return_attention_scores:
                x, scores[name] = x  # [batch, heads, tgt_len, tgt_len | src_len]
            return x

        x = attend(
            "self_attention", self.self_attention, self.self_attention_residual, x, lambda h: h, self_attention_mask
        )  # [batch, tgt_len, d_model]
        x = attend(
            "cross_attention", self.cross_attention, self.cross_attention_residual, x, lambda h: memory, memory_mask
        )  # [batch, tgt_len, d_model]
        x = self.feed_forward_residual(
            x, sublayer=lambda h: self.feed_forward(h, training=training), training=training
        )  # [batch, tgt_len, d_model]
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, x_shape, memory_shape):
        return x_shape


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
    """The decoder stack: positions, dropout, then N decoder layers (section 3.1).

    Takes the scaled target embeddings (shifted right: BOS first) and returns
    the final hidden states; the model projects them with the shared embedding.

    Args: as :class:`~tf_transformer.layers.stack.LayerStack`.

    Call args:
      embedded: ``[batch, tgt_len, d_model]``.
      memory: ``[batch, src_len, d_model]`` encoder output.
      self_attention_mask: ``[batch, 1, tgt_len, tgt_len]``.
      memory_mask: ``[batch, 1, 1, src_len]``.

      return_attention_scores: also return one dict of attention weights per
        layer (see :class:`DecoderLayer`).

    Returns:
      ``[batch, tgt_len, d_model]`` (and the weights when asked).
    """

    layer_class = DecoderLayer
    layers_attribute = "decoder_layers"

    def build(self, embedded_shape, memory_shape):
        self.position_layer.build(embedded_shape)
        for layer in self.decoder_layers:
            layer.build(embedded_shape, memory_shape)
        if self.final_norm is not None:
            self.final_norm.build(embedded_shape)

    def call(
        self, embedded, memory, self_attention_mask=None, memory_mask=None, training=None, return_attention_scores=False
    ):
        x = embedded + self.position_layer(embedded)[None]  # [batch, tgt_len, d_model]
        x = self.embedding_dropout(x, training=training)
        scores = []
        for layer in self.decoder_layers:
            x = layer(
                x,
                memory,
                self_attention_mask=self_attention_mask,
                memory_mask=memory_mask,
                training=training,
                return_attention_scores=return_attention_scores,
            )  # [batch, tgt_len, d_model]
            if return_attention_scores:
                x, weights = x
                scores.append(weights)
        return (self.finish(x), scores) if return_attention_scores else self.finish(x)

    def compute_output_shape(self, embedded_shape, memory_shape):
        return embedded_shape

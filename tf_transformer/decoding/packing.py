"""The real tokens of a padded batch as rows, and the encoder run on them (inference only).

A batch padded to its longest sentence is largely padding. Position-wise work
(projections, feed-forward networks, layer norms) on the real tokens' rows
skips it; only eq. 1 sees the padded batch (docs/design/decoding.md).
"""

from __future__ import annotations

import tensorflow as tf
from keras import ops

from tf_transformer import masks


class TokenPacking:
    """The real tokens of a padded ``[batch, len]`` batch as rows, and back.

    ``mask`` is ``[batch, len]`` boolean, ``True`` at real tokens.
    :meth:`take` gathers their ``n`` rows in order (sentence by sentence);
    :meth:`pad` puts rows back at their positions, with zeros at padding.
    """

    def __init__(self, mask):
        self.indices = tf.where(mask)  # [n, 2]: (sentence, position) of each real token
        self.shape = tf.shape(mask, out_type=tf.int64)  # [2]: batch, len

    def take(self, x):
        """``[batch, len, ...]`` → ``[n, ...]``."""
        return tf.gather_nd(x, self.indices)

    def pad(self, rows):
        """``[n, ...]`` → ``[batch, len, ...]``, zeros at padding."""
        return tf.scatter_nd(self.indices, rows, tf.concat([self.shape, tf.shape(rows, out_type=tf.int64)[1:]], 0))


def attend_tokens(attention, rows, tokens: TokenPacking, attention_mask):
    """Self-attention of a :class:`~tf_transformer.layers.attention.MultiHeadAttention` over packed rows.

    ``rows`` ``[n, d]`` are the real tokens that ``tokens`` took out of a
    ``[batch, len]`` batch. The projections multiply only these rows; queries,
    keys and values go back to their positions for eq. 1 within each sentence
    (``attention_mask`` ``[batch, 1, 1, len]``), and the heads of the real
    tokens come out again for W^O. Returns ``[n, output_dim]``.
    """
    q = attention.split_heads(tokens.pad(attention.query_dense(rows)), attention.key_dim)  # [batch, heads, len, d_k]
    k = attention.split_heads(tokens.pad(attention.key_dense(rows)), attention.key_dim)  # [batch, heads, len, d_k]
    v = attention.split_heads(tokens.pad(attention.value_dense(rows)), attention.value_dim)  # [batch, heads, len, d_v]
    heads, _ = attention.attention(q, k, v, attention_mask=attention_mask, training=False)  # [batch, heads, len, d_v]
    heads = tokens.take(ops.transpose(heads, (0, 2, 1, 3)))  # [n, heads, d_v]
    return attention.output_dense(
        ops.reshape(heads, (-1, attention.num_heads * attention.value_dim))
    )  # [n, output_dim]


def encode_layer_tokens(layer, rows, tokens: TokenPacking, attention_mask):
    """An :class:`~tf_transformer.layers.encoder.EncoderLayer` on packed rows ``[n, d_model]`` → ``[n, d_model]``."""
    x = layer.self_attention_residual(
        rows,
        sublayer=lambda h: attend_tokens(layer.self_attention, h, tokens, attention_mask),
        training=False,
    )  # [n, d_model]
    return layer.feed_forward_residual(
        x, sublayer=lambda h: layer.feed_forward(h, training=False), training=False
    )  # [n, d_model]


def encode_tokens(model, source_ids):
    """``model.encode`` for inference, the position-wise work on real tokens only.

    Returns ``(memory [batch, src_len, d_model], memory_mask [batch, 1, 1,
    src_len])``: the real positions as :meth:`~tf_transformer.model.Transformer.encode`
    computes them, zeros at padding, which every attention over the memory
    masks (a row of padding only has no real position: its memory is all
    zeros). The number of real tokens sets shapes inside, so this is for
    graphs, not XLA.
    """
    encoder = model.encoder
    memory_mask = masks.padding_mask(source_ids)  # [batch, 1, 1, src_len]
    embedded = model.source_embedding(source_ids)  # [batch, src_len, d_model]
    tokens = TokenPacking(memory_mask[:, 0, 0, :])
    x = tokens.take(embedded + encoder.position_layer(embedded)[None])  # [n, d_model]
    for layer in encoder.encoder_layers:
        x = encode_layer_tokens(layer, x, tokens, memory_mask)  # [n, d_model]
    return tokens.pad(encoder.finish(x)), memory_mask  # [batch, src_len, d_model]

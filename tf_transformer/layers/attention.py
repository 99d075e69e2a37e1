"""Scaled dot-product attention (eq. 1) and multi-head attention (section 3.2.2).

Eq. 1's rule is defined here once: :func:`scale_query` and :func:`masked_softmax`.
:class:`ScaledDotProductAttention` applies it to keys laid out ``[batch, heads,
k_len, d_k]`` (training, and the attention weights the views read); the search
applies the same two functions to its cache's layouts
(:mod:`tf_transformer.decoding.cached_attention`).
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tf_transformer.constants import MASK_VALUE


def scale_query(query):
    """``query`` ``[..., d_k]`` times 1/√d_k in its own dtype: eq. 1's scaling, on the queries (fewer than scores)."""
    d_k = ops.shape(query)[-1]
    return query * ops.cast(1.0 / ops.sqrt(ops.cast(d_k, "float32")), query.dtype)


def folded_query_scale(key_dim: int) -> float | None:
    """1/√d_k when it is a power of two (d_k a power of 4, as the paper's 64 is), else ``None``.

    Multiplying by a power of two is exact in every float type, so a copy of
    the query projection's kernel and bias multiplied by it gives the bits
    ``scale_query`` gives after the projection: decoding folds the scaling
    into its kernels (:func:`~tf_transformer.decoding.kernels.attention_kernels`)
    and saves a multiply per attention and step. Other scales would round
    differently, so they stay :func:`scale_query`'s.
    """
    exponent = math.log2(key_dim) / 2
    return 2.0**-exponent if exponent.is_integer() else None


def masked_softmax(scores, attention_mask, dtype, softmax=None):
    """Eq. 1's softmax over the last axis of ``scores`` (keys), computed in float32, returned in ``dtype``.

    float32 keeps it stable under mixed precision; keys where the boolean
    ``attention_mask`` (broadcastable to ``scores``; ``None``: every key) is
    ``False`` get exactly zero weight. ``softmax``: another kernel of the same
    function (decoding's, for few-row scores), by default Keras's.
    """
    scores = ops.cast(scores, "float32")
    if attention_mask is not None:
        scores = ops.where(attention_mask, scores, MASK_VALUE)
    weights = ops.softmax(scores, axis=-1) if softmax is None else softmax(scores)
    return ops.cast(weights, dtype)


@keras.saving.register_keras_serializable(package="tf_transformer")
class ScaledDotProductAttention(keras.layers.Layer):
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V, eq. 1 of section 3.2.1.

    Args:
      dropout: dropout rate on the attention weights (0 in the paper).

    Call args:
      query: ``[batch, heads, q_len, d_k]``.
      key: ``[batch, heads, k_len, d_k]``.
      value: ``[batch, heads, k_len, d_v]``.
      attention_mask: boolean, broadcastable to ``[batch, heads, q_len, k_len]``;
        ``True`` where a query may attend to a key.
      training: whether dropout is active.

    Returns:
      ``(output, weights)``: ``[batch, heads, q_len, d_v]`` in the compute dtype
      and ``[batch, heads, q_len, k_len]`` attention weights.
    """

    def __init__(self, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.weights_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="weights_dropout")

    def call(self, query, key, value, attention_mask=None, training=None):
        scores = ops.einsum("bhqd,bhkd->bhqk", scale_query(query), key)  # [batch, heads, q_len, k_len]
        weights = masked_softmax(scores, attention_mask, self.compute_dtype)  # [batch, heads, q_len, k_len]
        dropped = self.weights_dropout(weights, training=training)
        output = ops.einsum("bhqk,bhkd->bhqd", dropped, value)  # [batch, heads, q_len, d_v]
        return output, weights

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O, section 3.2.2.

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V). The per-head widths ``key_dim``
    (d_k) and ``value_dim`` (d_v) are independent of ``d_model / num_heads`` so
    Table 3 rows A and B can vary them.

    Args:
      num_heads: h.
      key_dim: d_k, width of each head's queries and keys.
      value_dim: d_v, width of each head's values (``None`` → ``key_dim``).
      output_dim: width of the output (``None`` → the query's last dimension).
      dropout: dropout on the attention weights.
      use_bias: whether the projections have biases.

    Call args:
      query: ``[batch, q_len, d_query]``.
      value: ``[batch, k_len, d_value]``; the memory attended to.
      key: ``[batch, k_len, d_key]``; defaults to ``value``.
      attention_mask: boolean, broadcastable to ``[batch, heads, q_len, k_len]``.
      training: whether dropout is active.
      return_attention_scores: also return the ``[batch, heads, q_len, k_len]`` weights.

    Returns:
      ``[batch, q_len, output_dim]`` (and the weights when asked).

    Inference interface (what :mod:`tf_transformer.inference` reads): ``num_heads``,
    ``key_dim``, ``value_dim``, the projections ``query_dense``, ``key_dense``,
    ``value_dense`` and ``output_dense`` (W^O), :meth:`split_heads` and
    ``attention`` (the :class:`ScaledDotProductAttention`).
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        output_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim is not None else key_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        def dense(units, name):
            return keras.layers.Dense(
                units,
                use_bias=use_bias,
                kernel_initializer=self._new_initializer(),
                dtype=self.dtype_policy,
                name=name,
            )

        self.query_dense = dense(num_heads * key_dim, "query")
        self.key_dense = dense(num_heads * key_dim, "key")
        self.value_dense = dense(num_heads * self.value_dim, "value")
        self._output_dense = None  # created in build(): needs the query width by default
        self.attention = ScaledDotProductAttention(dropout, dtype=self.dtype_policy, name="attention")

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        output_dim = self.output_dim if self.output_dim is not None else query_shape[-1]
        self._output_dense = keras.layers.Dense(
            output_dim,
            use_bias=self.use_bias,
            kernel_initializer=self._new_initializer(),
            dtype=self.dtype_policy,
            name="output",
        )
        self._output_dense.build((None, None, self.num_heads * self.value_dim))

    @property
    def output_dense(self):
        """W^O, the ``Dense`` layer after the heads (created in ``build``)."""
        return self._output_dense

    def _new_initializer(self):
        # A fresh instance per kernel: Keras warns when one seeded instance is reused.
        return keras.initializers.deserialize(keras.initializers.serialize(self.kernel_initializer))

    def split_heads(self, x, depth):
        """``[batch, len, heads * depth]`` → ``[batch, heads, len, depth]``."""
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        x = ops.reshape(x, (batch, length, self.num_heads, depth))  # [batch, len, heads, depth]
        return ops.transpose(x, (0, 2, 1, 3))  # [batch, heads, len, depth]

    def call(
        self,
        query,
        value,
        key=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        key = value if key is None else key
        q = self.split_heads(self.query_dense(query), self.key_dim)  # [batch, heads, q_len, d_k]
        k = self.split_heads(self.key_dense(key), self.key_dim)  # [batch, heads, k_len, d_k]
        v = self.split_heads(self.value_dense(value), self.value_dim)  # [batch, heads, k_len, d_v]
        heads, weights = self.attention(q, k, v, attention_mask=attention_mask, training=training)
        batch, q_len = ops.shape(query)[0], ops.shape(query)[1]
        heads = ops.transpose(heads, (0, 2, 1, 3))  # [batch, q_len, heads, d_v]
        heads = ops.reshape(heads, (batch, q_len, self.num_heads * self.value_dim))  # [batch, q_len, h·d_v]
        output = self._output_dense(heads)  # [batch, q_len, output_dim]
        if return_attention_scores:
            return output, weights
        return output

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        output_dim = self.output_dim if self.output_dim is not None else query_shape[-1]
        return tuple(query_shape[:-1]) + (output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            output_dim=self.output_dim,
            dropout=self.dropout,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config

"""Scaled dot-product attention (eq. 1) and multi-head attention (section 3.2.2)."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from tf_transformer.layers.decoding_kernels import decoding_kernel, project

# Masked scores are replaced by this value *after* casting to float32, so the
# softmax gives padded keys a weight of exactly 0 under float16 and bfloat16 too
# (float16 cannot hold -1e9; adding a mask in float16 would overflow to -inf and
# turn fully masked rows into NaN).
MASK_VALUE = -1e9


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
        d_k = ops.shape(query)[-1]
        query = query * ops.cast(1.0 / ops.sqrt(ops.cast(d_k, "float32")), query.dtype)
        scores = ops.einsum("bhqd,bhkd->bhqk", query, key)  # [batch, heads, q_len, k_len]
        # Softmax in float32: stable under mixed precision and exact zeros when masked.
        scores = ops.cast(scores, "float32")
        if attention_mask is not None:
            scores = ops.where(attention_mask, scores, MASK_VALUE)  # [batch, heads, q_len, k_len]
        weights = ops.softmax(scores, axis=-1)  # [batch, heads, q_len, k_len]
        weights = ops.cast(weights, self.compute_dtype)
        dropped = self.weights_dropout(weights, training=training)
        output = ops.einsum("bhqk,bhkd->bhqd", dropped, value)  # [batch, heads, q_len, d_v]
        return output, weights

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout)
        return config


def blocked_attention(query, key, value, attention_mask):
    """Eq. 1 over keys and values stored in blocks of positions (cached decoding, inference only).

    ``query`` ``[groups, heads, size, d_k]``; ``key`` ``[blocks, groups, heads,
    slots, d_k]`` and ``value`` ``[blocks, groups, heads, slots, d_v]``;
    ``attention_mask`` boolean ``[groups, 1, size, blocks * slots]``, over the
    blocks laid end to end. The scores are laid end to end the same way (a
    transpose of ``size × blocks × slots`` scores per head, not of the keys)
    for one softmax across all blocks, as :class:`ScaledDotProductAttention`
    over the blocks' concatenation, without concatenating the blocks (which
    would copy them). One fused softmax costs less than the max, exponentials
    and sums across the block axis as separate ops (in isolation, the scores of
    3 blocks at ``small``, one thread: ~230 → ~150 µs a layer). Returns
    ``[groups, heads, size, d_v]``.
    """
    d_k = ops.shape(query)[-1]
    blocks, _, heads, slots, _ = ops.shape(key)  # Python ints where static (a view of a cache: blocks is not)
    query = query * ops.cast(1.0 / ops.sqrt(ops.cast(d_k, "float32")), query.dtype)
    scores = tf.linalg.matmul(query[None], key, transpose_b=True)  # [blocks, groups, heads, size, slots]
    scores = tf.transpose(ops.cast(scores, "float32"), (1, 2, 3, 0, 4))  # [groups, heads, size, blocks, slots]
    size = ops.shape(query)[2]
    scores = tf.reshape(scores, [-1, heads, size, blocks * slots])  # [groups, heads, size, blocks * slots]
    weights = ops.softmax(ops.where(attention_mask, scores, MASK_VALUE), axis=-1)  # float32 softmax, as eq. 1 above
    weights = tf.reshape(
        ops.cast(weights, value.dtype), [-1, heads, size, blocks, slots]
    )  # [groups, heads, size, blocks, slots]
    output = tf.linalg.matmul(tf.transpose(weights, (3, 0, 1, 2, 4)), value)  # [blocks, groups, heads, size, d_v]
    # Summed in float32 (the casts are no-ops for float32), so that a bfloat16 output is
    # rounded once, as a single product's would be.
    return ops.cast(ops.sum(ops.cast(output, "float32"), axis=0), value.dtype)  # [groups, heads, size, d_v]


def transposed_key_attention(query, key_t, value, attention_mask):
    """Eq. 1 over keys stored transposed (cached decoding, inference only).

    ``query`` ``[groups, heads, size, d_k]``; ``key_t`` ``[groups, heads, d_k,
    k_len]``, as :meth:`MultiHeadAttention.project_key_value` returns it; ``value`` ``[groups, heads, k_len, d_v]``;
    ``attention_mask`` broadcastable to ``[groups, heads, size, k_len]``. The
    encoder-decoder keys are the same at every step of a search: transposed
    once, each step's Q Kᵀ is a plain product, where the product with a
    transposed operand ran ~1.3× slower for these few-row matrices (2-core
    AVX2 CPU, oneDNN). Returns ``[groups, heads, size, d_v]``.
    """
    d_k = ops.shape(query)[-1]
    query = query * ops.cast(1.0 / ops.sqrt(ops.cast(d_k, "float32")), query.dtype)
    scores = ops.cast(tf.linalg.matmul(query, key_t), "float32")  # [groups, heads, size, k_len]
    if attention_mask is not None:
        scores = ops.where(attention_mask, scores, MASK_VALUE)  # float32 softmax, as eq. 1 above
    weights = ops.cast(ops.softmax(scores, axis=-1), value.dtype)  # [groups, heads, size, k_len]
    return tf.linalg.matmul(weights, value)  # [groups, heads, size, d_v]


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
        return self._output_dense

    def _new_initializer(self):
        # A fresh instance per kernel: Keras warns when one seeded instance is reused.
        return keras.initializers.deserialize(keras.initializers.serialize(self.kernel_initializer))

    def _split_heads(self, x, depth):
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
        q = self._split_heads(self.query_dense(query), self.key_dim)  # [batch, heads, q_len, d_k]
        k = self._split_heads(self.key_dense(key), self.key_dim)  # [batch, heads, k_len, d_k]
        v = self._split_heads(self.value_dense(value), self.value_dim)  # [batch, heads, k_len, d_v]
        heads, weights = self.attention(q, k, v, attention_mask=attention_mask, training=training)
        batch, q_len = ops.shape(query)[0], ops.shape(query)[1]
        heads = ops.transpose(heads, (0, 2, 1, 3))  # [batch, q_len, heads, d_v]
        heads = ops.reshape(heads, (batch, q_len, self.num_heads * self.value_dim))  # [batch, q_len, h·d_v]
        output = self._output_dense(heads)  # [batch, q_len, output_dim]
        if return_attention_scores:
            return output, weights
        return output

    def attend_tokens(self, rows, tokens, attention_mask):
        """Self-attention of the real tokens of a padded batch (inference only).

        ``rows`` ``[n, d]`` are the real tokens that ``tokens`` (a
        :class:`~tf_transformer.masks.TokenPacking`) took out of a ``[batch,
        len]`` batch. The projections multiply only these rows; queries, keys
        and values go back to their positions for eq. 1 within each sentence
        (``attention_mask`` ``[batch, 1, 1, len]``), and the heads of the real
        tokens come out again for W^O. Returns ``[n, output_dim]``.
        """
        q = self._split_heads(tokens.pad(self.query_dense(rows)), self.key_dim)  # [batch, heads, len, d_k]
        k = self._split_heads(tokens.pad(self.key_dense(rows)), self.key_dim)  # [batch, heads, len, d_k]
        v = self._split_heads(tokens.pad(self.value_dense(rows)), self.value_dim)  # [batch, heads, len, d_v]
        heads, _ = self.attention(q, k, v, attention_mask=attention_mask, training=False)  # [batch, heads, len, d_v]
        heads = tokens.take(ops.transpose(heads, (0, 2, 1, 3)))  # [n, heads, d_v]
        return self._output_dense(ops.reshape(heads, (-1, self.num_heads * self.value_dim)))  # [n, output_dim]

    def project_key_value(self, memory, tokens=None):
        """Keys and values of ``memory`` split into heads, for cached decoding (see :meth:`attend`).

        Returns ``(keys [batch, heads, d_k, len], values [batch, heads, len, d_v])``:
        the keys transposed, as :func:`transposed_key_attention` takes them. The
        decoder computes these once per sentence for encoder-decoder attention.
        With ``tokens`` (a :class:`~tf_transformer.masks.TokenPacking` of the
        memory's real positions) only those rows are projected; padded
        positions, which attention masks, get zeros.
        """
        if tokens is None:
            key, value = self.key_dense(memory), self.value_dense(memory)  # [batch, len, h·d]
        else:
            rows = tokens.take(memory)  # [n, d_model]
            key, value = tokens.pad(self.key_dense(rows)), tokens.pad(self.value_dense(rows))  # [batch, len, h·d]
        key = ops.transpose(self._split_heads(key, self.key_dim), (0, 1, 3, 2))  # [batch, heads, d_k, len]
        return key, self._split_heads(value, self.value_dim)  # value: [batch, heads, len, d_v]

    def group_heads(self, x, size, depth):
        """``[groups * size, heads * depth]`` rows → ``[groups, heads, size, depth]``.

        ``size`` is the rows per group; a Python int (the beam size of a
        search) keeps the reshape's shape a constant, not ops of every step.
        """
        x = ops.reshape(x, (-1, size, self.num_heads, depth))  # [groups, size, heads, depth]
        return ops.transpose(x, (0, 2, 1, 3))  # [groups, heads, size, depth]

    def _ungroup_heads(self, x):
        """``[groups, heads, size, d_v]`` → ``[groups * size, heads * d_v]`` rows."""
        x = ops.transpose(x, (0, 2, 1, 3))  # [groups, size, heads, d_v]
        return ops.reshape(x, (-1, self.num_heads * self.value_dim))  # [groups * size, heads * d_v]

    def split_query_key_value(self, projected, size):
        """Rows projected by the fused self-attention kernel → query, key and value heads.

        ``projected`` is ``[groups * size, h·d_k + h·d_k + h·d_v]`` (see
        :meth:`decoding_weights`), ``size`` rows per group (see
        :meth:`group_heads`); returns three ``[groups, heads, size, d]``.
        When ``d_k == d_v`` one transpose moves all three and slicing its
        first axis shares the buffer; otherwise each is split and moved.
        """
        if self.key_dim == self.value_dim:
            x = ops.reshape(projected, (-1, size, 3, self.num_heads, self.key_dim))  # [groups, size, 3, heads, d]
            x = ops.transpose(x, (2, 0, 3, 1, 4))  # [3, groups, heads, size, d]
            return [x[0], x[1], x[2]]  # slices of the first axis: views (when aligned), not copies
        widths = [self.num_heads * self.key_dim] * 2 + [self.num_heads * self.value_dim]
        query, key, value = tf.split(projected, widths, axis=-1)  # [groups * size, h·d]
        depths = (self.key_dim, self.key_dim, self.value_dim)
        return [self.group_heads(x, size, depth) for x, depth in zip((query, key, value), depths, strict=True)]

    def decoding_weights(self, self_attention: bool) -> dict:
        """This layer's kernels laid out for :meth:`attend`, prepared once per search.

        ``input`` projects a hypothesis's row to its query, and for
        self-attention to its query, key and value in one product
        (``[h·d_k | h·d_k | h·d_v]`` wide); ``output`` is W^O. Both stay in
        Keras's ``[in, units]`` layout, where these products ran faster than
        against transposed kernels (see :mod:`tf_transformer.layers.decoding_kernels`).
        """
        inputs = [self.query_dense, self.key_dense, self.value_dense] if self_attention else [self.query_dense]
        return {
            "input": decoding_kernel(inputs, self.compute_dtype, transpose=False),
            "output": decoding_kernel([self._output_dense], self.compute_dtype, transpose=False),
        }

    def attend(self, query_heads, key_heads, value_heads, kernels, attention_mask=None):
        """Queries of groups of hypotheses over keys each group shares (inference only).

        ``query_heads`` ``[groups, heads, size, d_k]`` are the queries of
        ``size`` hypotheses per group (the beams of one sentence, projected with
        ``kernels["input"]`` of :meth:`decoding_weights`, see :meth:`group_heads`);
        a group attends over its own keys and values, never copied per beam:
        keys stored transposed, ``key_heads`` ``[groups, heads, d_k, k_len]`` (as
        :meth:`project_key_value` returns them; not the ``[.., k_len, d_k]`` of eq. 1), and
        ``value_heads`` ``[groups, heads, k_len, d_v]`` (attention_mask
        broadcastable to ``[groups, heads, size, k_len]``, see
        :func:`transposed_key_attention`), or a cache in blocks ``[blocks,
        groups, heads, slots, d]`` (mask ``[groups, 1, size, blocks * slots]``,
        see :func:`blocked_attention`). The group's queries take the place of
        the query positions of eq. 1. Returns ``[groups * size, output_dim]``.
        """
        if len(key_heads.shape) == 5:
            heads = blocked_attention(query_heads, key_heads, value_heads, attention_mask)
        else:
            heads = transposed_key_attention(query_heads, key_heads, value_heads, attention_mask)
        return project(self._ungroup_heads(heads), kernels["output"])  # [groups * size, output_dim]

    def attend_to_itself(self, value_heads, kernels):
        """Attention of each query over its own key and value alone (inference only).

        With a single key, eq. 1's softmax gives it weight 1, so each head's
        output is its value: the first decoding step, where position 0 sees
        only itself. ``value_heads`` ``[groups, heads, size, d_v]``; returns
        ``[groups * size, output_dim]``, as :meth:`attend` would.
        """
        return project(self._ungroup_heads(value_heads), kernels["output"])  # [groups * size, output_dim]

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

"""Multi-head attention over a cache: what the search computes where training calls the layer.

:func:`attend_with_cache` is the decoding form of a
:class:`~tf_transformer.layers.attention.MultiHeadAttention` call, with the
cache as an argument and the updated cache returned (keras-hub's
``CachedMultiHeadAttention`` contract): for self-attention it projects the new
position's query, key and value, writes the key and value into the cache and
attends over it; for encoder-decoder attention the cache is static (the
sentence's memory keys and values) and only the query is projected.

Eq. 1's rule (the query's scaling, the float32 masked softmax) is the layer's
own (:func:`~tf_transformer.layers.attention.scale_query`, folded into the
query's kernel where that gives the same bits,
:func:`~tf_transformer.layers.attention.masked_softmax`); only its two products
differ here, because the search's keys are laid out differently. A search keeps
``size`` hypotheses (beams) per sentence, grouped by sentence, and a group
attends over keys it shares: the encoder-decoder keys of its sentence, stored
transposed once per search (:func:`transposed_key_attention`), or the
self-attention cache, stored in blocks of positions (:func:`blocked_attention`;
:mod:`tf_transformer.decoding.cache`). Passing the cache to the layer's own
products instead (the blocks joined into one ``[batch, heads, k_len, d]``
tensor, a copy every step, and memory keys untransposed) decodes slower
(docs/design/decoding.md, "Measured and not adopted"), so the search keeps
these products, in this module alone.

A step's attention tensors are a few rows each, where oneDNN's kernels for
transposes, batched products and softmax cost more to set up than to run
(TensorFlow rewrites those ops to oneDNN's on CPUs): the search moves axes
with :func:`transpose` (Eigen's, on the bits), multiplies the memory keys with
``BatchMatMulV3`` (Eigen's) and normalizes with :func:`few_row_softmax`; the
self-attention products over the cache are Eigen's for few hypotheses and
oneDNN's, faster there, for many (:data:`EIGEN_PRODUCT_ROWS`).
docs/design/decoding.md gives the measurements.

The functions use only the layer's documented inference interface
(``num_heads``, ``key_dim``, ``value_dim``, ``key_dense``, ``value_dense``,
``split_heads``) and its kernels laid out for decoding
(:mod:`tf_transformer.decoding.kernels`); no layer knows about decoding.
"""

from __future__ import annotations

import threading

import tensorflow as tf
from keras import ops

from tf_transformer.decoding import cache as caching
from tf_transformer.decoding.kernels import project
from tf_transformer.decoding.xla import in_xla
from tf_transformer.layers.attention import folded_query_scale, masked_softmax, scale_query

# The integer of each float's width: a transpose moves bits, whatever they mean.
_SAME_WIDTH = {tf.float32: tf.int32, tf.bfloat16: tf.int16, tf.float16: tf.int16}


def transpose(x, perm):
    """``tf.transpose`` by Eigen's kernel: of the same bits as integers, where TensorFlow's CPU
    rewrite would run a float transpose through a oneDNN reorder set up per call (several times
    slower for a step's few-row tensors). The values are moved, never converted."""
    if in_xla() or x.dtype not in _SAME_WIDTH:
        return tf.transpose(x, perm)
    bits = tf.bitcast(x, _SAME_WIDTH[x.dtype])
    return tf.bitcast(tf.transpose(bits, perm), x.dtype)


def few_row_softmax(scores):
    """softmax(``scores``) over the last axis as exp(log_softmax): TensorFlow's ``LogSoftmax`` and
    ``Exp`` kernels (Eigen's) where ``Softmax`` is rewritten to oneDNN's, slower on a step's few rows."""
    return tf.exp(tf.nn.log_softmax(scores, axis=-1))


# Hypotheses a step computes at or below which the self-attention products over the cache run
# faster by Eigen's kernel (``BatchMatMulV3``) than by oneDNN's: one sentence of 4 beams decoded
# 1.13× (float32) and 1.24× (bfloat16) faster; 8 sentences no faster, or slower in bfloat16
# (docs/design/decoding.md).
EIGEN_PRODUCT_ROWS = 16

# The products :func:`blocked_attention` uses while :func:`products_by_rows` traces (True: Eigen's).
_chosen = threading.local()


def products_by_rows(rows, trace):
    """``trace()``, its self-attention products over the cache chosen once for ``rows`` (int32 scalar).

    A loop whose steps all compute ``rows`` hypotheses (the steps between two
    compactions of a beam search, a greedy search) is traced twice, once with
    Eigen's products and once with oneDNN's, and a ``tf.cond`` on ``rows`` runs
    one of them: one choice per loop instead of a ``tf.cond`` in every layer at
    every step, whose Switches, Merge and row count were ops of the step.
    """
    if in_xla():
        return trace()

    def traced(eigen: bool):
        before = getattr(_chosen, "eigen", None)
        _chosen.eigen = eigen
        try:
            return trace()
        finally:
            _chosen.eigen = before

    return tf.cond(rows <= EIGEN_PRODUCT_ROWS, lambda: traced(True), lambda: traced(False))


def blocked_attention(query, key, value, attention_mask, score_shapes=None, scaled=False):
    """Eq. 1 over keys and values stored in blocks of positions.

    ``query`` ``[groups, heads, size, d_k]``; ``key`` ``[blocks, groups, heads,
    slots, d_k]`` and ``value`` ``[blocks, groups, heads, slots, d_v]``;
    ``attention_mask`` boolean ``[groups, 1, size, blocks * slots]``, over the
    blocks laid end to end. The scores are laid end to end the same way (a
    transpose of ``size × blocks × slots`` scores per head, not of the keys)
    for one float32 softmax across all blocks, as eq. 1 over the blocks'
    concatenation, without concatenating the blocks (which would copy them).
    The products run by Eigen's kernel for at most :data:`EIGEN_PRODUCT_ROWS`
    query rows, by oneDNN's for more: as :func:`products_by_rows` chose while it
    traces, else by the static rows, else by a ``tf.cond``. ``score_shapes``:
    the scores' shapes laid end to end and by block
    (:attr:`~tf_transformer.decoding.cache.CacheStep.score_shapes`, built once
    per step for every layer), else built here from the keys' shape.
    ``scaled``: the query already carries eq. 1's 1/√d_k. Returns ``[groups,
    heads, size, d_v]``.
    """
    if score_shapes is None:
        blocks, _, heads, slots, _ = ops.shape(key)  # Python ints where static (a view of a cache: blocks is not)
        size = ops.shape(query)[2]
        score_shapes = ([-1, heads, size, blocks * slots], [-1, heads, size, blocks, slots])
    query = query if scaled else scale_query(query)  # [groups, heads, size, d_k]

    def run(matmul):
        return _blocked_attention(query, key, value, attention_mask, matmul, score_shapes)

    if in_xla():
        return run(tf.linalg.matmul)
    eigen = getattr(_chosen, "eigen", None)
    if eigen is not None:
        return run(_eigen_matmul if eigen else tf.linalg.matmul)
    rows = ops.shape(query)[0] * ops.shape(query)[2]  # groups * size: a Python int where static
    if isinstance(rows, int):
        return run(_eigen_matmul if rows <= EIGEN_PRODUCT_ROWS else tf.linalg.matmul)
    return tf.cond(rows <= EIGEN_PRODUCT_ROWS, lambda: run(_eigen_matmul), lambda: run(tf.linalg.matmul))


# The float types ``BatchMatMulV3`` has a CPU kernel for (not float16: there it is ``BatchMatMulV2``'s).
_EIGEN_PRODUCT_TYPES = (tf.float32, tf.bfloat16)


def _eigen_matmul(x, y, transpose_b=False):
    """``tf.linalg.matmul`` of batched operands by Eigen's kernel (``BatchMatMulV3``, not rewritten to oneDNN's),
    where the dtype has one on CPUs (:data:`_EIGEN_PRODUCT_TYPES`)."""
    if in_xla() or x.dtype not in _EIGEN_PRODUCT_TYPES:
        return tf.linalg.matmul(x, y, transpose_b=transpose_b)
    return tf.raw_ops.BatchMatMulV3(x=x, y=y, adj_y=transpose_b, Tout=x.dtype)


def _blocked_attention(query, key, value, attention_mask, matmul, score_shapes):
    """:func:`blocked_attention` with the products of ``matmul``; ``query`` scaled."""
    end_to_end, by_block = score_shapes
    scores = matmul(query[None], key, transpose_b=True)  # [blocks, groups, heads, size, slots]
    scores = transpose(ops.cast(scores, "float32"), (1, 2, 3, 0, 4))  # [groups, heads, size, blocks, slots]
    scores = tf.reshape(scores, end_to_end)  # [groups, heads, size, blocks * slots]
    weights = masked_softmax(
        scores, attention_mask, value.dtype, few_row_softmax
    )  # [groups, heads, size, blocks * slots]
    weights = tf.reshape(weights, by_block)  # [groups, heads, size, blocks, slots]
    output = matmul(transpose(weights, (3, 0, 1, 2, 4)), value)  # [blocks, groups, heads, size, d_v]
    # Summed in float32 (the casts are no-ops for float32), so that a bfloat16 output is
    # rounded once, as a single product's would be.
    return ops.cast(ops.sum(ops.cast(output, "float32"), axis=0), value.dtype)  # [groups, heads, size, d_v]


def transposed_key_attention(query, key_t, value, attention_mask, scaled=False):
    """Eq. 1 over keys stored transposed.

    ``query`` ``[groups, heads, size, d_k]``; ``key_t`` ``[groups, heads, d_k,
    k_len]``, as :func:`project_key_value` returns it; ``value`` ``[groups,
    heads, k_len, d_v]``; ``attention_mask`` broadcastable to ``[groups, heads,
    size, k_len]``. The encoder-decoder keys are the same at every step of a
    search: transposed once, each step's Q Kᵀ is a plain product, which runs
    faster than a product with a transposed operand for these few-row
    matrices; ``BatchMatMulV3`` (Eigen's kernel, not rewritten to oneDNN's)
    runs them faster still. Keys and values in float32 (:func:`project_key_value`)
    take a 16-bit query cast to float32 and give the output back in its dtype.
    ``scaled``: the query already carries eq. 1's 1/√d_k. Returns ``[groups,
    heads, size, d_v]`` in the query's dtype.
    """
    rows = ops.cast(query, key_t.dtype)  # [groups, heads, size, d_k]
    scores = _eigen_matmul(rows if scaled else scale_query(rows), key_t)  # [groups, heads, size, k_len]
    weights = masked_softmax(scores, attention_mask, value.dtype, few_row_softmax)  # [groups, heads, size, k_len]
    return ops.cast(_eigen_matmul(weights, value), query.dtype)  # [groups, heads, size, d_v]


def project_key_value(attention, memory, tokens=None):
    """Keys and values of ``memory`` ``[batch, len, d]`` split into heads, once per search.

    Returns ``(keys [batch, heads, d_k, len], values [batch, heads, len, d_v])``:
    the keys transposed, as :func:`transposed_key_attention` takes them, both in
    float32 whatever the compute dtype: Eigen's 16-bit batched product is slower
    than its float32 one on CPUs, the scores are wanted in float32 for the
    softmax anyway, and the cast is paid once per search, not per step. With
    ``tokens`` (a :class:`~tf_transformer.decoding.packing.TokenPacking` of
    the memory's real positions) only those rows are projected; padded
    positions, which attention masks, get zeros.
    """
    if tokens is None:
        key, value = attention.key_dense(memory), attention.value_dense(memory)  # [batch, len, h·d]
    else:
        rows = tokens.take(memory)  # [n, d_model]
        key = tokens.pad(attention.key_dense(rows))  # [batch, len, h·d_k]
        value = tokens.pad(attention.value_dense(rows))  # [batch, len, h·d_v]
    key = transpose(attention.split_heads(ops.cast(key, "float32"), attention.key_dim), (0, 1, 3, 2))
    # key: [batch, heads, d_k, len]
    return key, attention.split_heads(ops.cast(value, "float32"), attention.value_dim)  # [batch, heads, len, d_v]


def group_heads(attention, x, size, depth):
    """``[groups * size, heads * depth]`` rows → ``[groups, heads, size, depth]``.

    ``size`` is the rows per group; a Python int (the beam size of a search)
    keeps the reshape's shape a constant, not ops of every step.
    """
    x = ops.reshape(x, (-1, size, attention.num_heads, depth))  # [groups, size, heads, depth]
    return transpose(x, (0, 2, 1, 3))  # [groups, heads, size, depth]


def ungroup_heads(attention, x):
    """``[groups, heads, size, d_v]`` → ``[groups * size, heads * d_v]`` rows."""
    x = transpose(x, (0, 2, 1, 3))  # [groups, size, heads, d_v]
    return ops.reshape(x, (-1, attention.num_heads * attention.value_dim))  # [groups * size, heads * d_v]


def split_query_key_value(attention, projected, size):
    """Rows projected by the fused self-attention kernel → ``(query heads, new keys and values)``.

    ``projected`` is ``[groups * size, h·d_k + h·d_k + h·d_v]`` (see
    :func:`~tf_transformer.decoding.kernels.attention_kernels`), ``size`` rows
    per group; the query is ``[groups, heads, size, d_k]``. Keys and values
    come laid out as the layer's cache keeps them
    (:func:`~tf_transformer.decoding.cache.layer_slots`): when ``d_k == d_v``
    one transpose moves all three and ``"key_value"`` ``[2, groups, heads,
    size, d]`` is a slice of its first axis, sharing the buffer; otherwise
    ``"key"`` and ``"value"`` ``[1, groups, heads, size, d_k | d_v]`` are split
    and moved apart.
    """
    heads, key_dim, value_dim = attention.num_heads, attention.key_dim, attention.value_dim
    if key_dim == value_dim:
        x = ops.reshape(projected, (-1, size, 3, heads, key_dim))  # [groups, size, 3, heads, d]
        x = transpose(x, (2, 0, 3, 1, 4))  # [3, groups, heads, size, d]
        return x[0], {"key_value": x[1:]}  # slices of the first axis: views (when aligned), not copies
    query, key, value = tf.split(
        projected, [heads * key_dim] * 2 + [heads * value_dim], axis=-1
    )  # [groups * size, h·d]
    return group_heads(attention, query, size, key_dim), {
        "key": group_heads(attention, key, size, key_dim)[None],
        "value": group_heads(attention, value, size, value_dim)[None],
    }


def attend(attention, query_heads, key_heads, value_heads, kernels, attention_mask=None, score_shapes=None):
    """Queries of groups of hypotheses over keys each group shares; W^O applied.

    ``query_heads`` ``[groups, heads, size, d_k]`` (projected with
    ``kernels["input"]``, see :func:`group_heads`); keys and values, never
    copied per hypothesis, either transposed memory keys ``[groups, heads,
    d_k, k_len]`` with values ``[groups, heads, k_len, d_v]`` (mask
    broadcastable to ``[groups, heads, size, k_len]``), or a cache in blocks
    ``[blocks, groups, heads, slots, d]`` (mask ``[groups, 1, size, blocks *
    slots]``). Returns ``[groups * size, output_dim]``.
    """
    scaled = folded_query_scale(attention.key_dim) is not None  # as attention_kernels folded it
    if len(key_heads.shape) == 5:
        heads = blocked_attention(query_heads, key_heads, value_heads, attention_mask, score_shapes, scaled)
    else:
        heads = transposed_key_attention(query_heads, key_heads, value_heads, attention_mask, scaled)
    return project(ungroup_heads(attention, heads), kernels["output"])  # [groups * size, output_dim]


def attend_to_itself(attention, value_heads, kernels):
    """Attention of each query over its own key and value alone; W^O applied.

    With a single key, eq. 1's softmax gives it weight 1, so each head's output
    is its value: the first decoding step, where position 0 sees only itself.
    ``value_heads`` ``[groups, heads, size, d_v]``; returns ``[groups * size,
    output_dim]``, as :func:`attend` would.
    """
    return project(ungroup_heads(attention, value_heads), kernels["output"])  # [groups * size, output_dim]


def attend_with_cache(attention, rows, cache, kernels, attention_mask, size, update=None, first_of=None):
    """One new position per hypothesis attends over ``cache``: ``(output [groups * size, output_dim], cache)``.

    Args:
      attention: the :class:`~tf_transformer.layers.attention.MultiHeadAttention`.
      rows: ``[groups * size, d_model]``, one row per hypothesis, ``size`` per
        sentence (a Python int), consecutive.
      cache: with ``update``, the layer's self-attention cache in blocks
        (:func:`~tf_transformer.decoding.cache.layer_slots`), used linearly:
        only the returned one is valid. Without: a static cache ``{"key",
        "value"}``, the memory's transposed keys ``[groups, heads, d_k,
        k_len]`` and values ``[groups, heads, k_len, d_v]``
        (:func:`project_key_value`), returned as given.
      kernels: the layer's kernels for decoding
        (:func:`~tf_transformer.decoding.kernels.attention_kernels`): ``input``
        projects query, key and value (fused) with ``update``, the query alone
        without; ``output`` is W^O.
      attention_mask: without ``update``, broadcastable to ``[groups, heads,
        size, k_len]``; with it, ``[groups, 1, size, blocks read * slots]``
        (:attr:`~tf_transformer.decoding.cache.CacheStep.mask`).
      update: the :class:`~tf_transformer.decoding.cache.CacheStep` where the
        rows' keys and values are written and which blocks are read.
      first_of: position 0 with one row per sentence standing for all
        ``first_of`` hypotheses (``size`` is 1): its key and value fill every
        hypothesis's slot, and the output, which sees position 0 alone (weight
        1), is the value itself; ``attention_mask`` is unused.
    """
    if update is None:
        query = group_heads(
            attention, project(rows, kernels["input"]), size, attention.key_dim
        )  # [groups, heads, size, d_k]
        return attend(attention, query, cache["key"], cache["value"], kernels, attention_mask), cache
    projected = project(rows, kernels["input"])  # [groups * size, h·d_k + h·d_k + h·d_v]
    query, new = split_query_key_value(attention, projected, size)  # query [groups, heads, size, d_k]
    written = caching.write_layer(cache, new, update, first_of)
    if first_of is not None:
        value = new["key_value"][1] if "key_value" in new else new["value"][0]  # [groups, heads, 1, d_v]
        return attend_to_itself(attention, value, kernels), written  # [groups, output_dim]
    key, value = caching.read_layer(written, update)  # [blocks, groups, heads, slots, d_k | d_v]
    return attend(attention, query, key, value, kernels, attention_mask, update.score_shapes), written

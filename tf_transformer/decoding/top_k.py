"""An exact top-k over long rows, in chunks: ``tf.math.top_k``'s values, indices and order, cheaper.

Beam search picks each sentence's ``2K`` best continuations among ``K ×
vocabulary`` sums of a beam's score and a token's log-probability; TensorFlow's
CPU TopK costs the same per entry however small ``k``. The measurement behind
this: docs/design/decoding.md ("Chunked top-k of the beams' sums").
"""

from __future__ import annotations

import tensorflow as tf


def _chunk_size(vocab) -> int | None:
    """A divisor of ``vocab`` to split rows into for :func:`top_k_rows` (None: not worth it)."""
    if vocab is None or vocab < 1024:
        return None
    for size in range(64, 16, -1):  # chunks of 17..64 entries
        if vocab % size == 0:
            return size
    return None


def top_k_rows(x, k: int, offsets=None):
    """``tf.math.top_k(x, k)`` over the last axis of ``x`` ``[..., n]``: same values, indices and order.

    TensorFlow's CPU TopK takes ~3 ns per entry however small ``k``; for a
    vocabulary-wide row it is cheaper to take the maximum of each chunk of
    ~64 entries, keep the ``k`` chunks with the largest maxima (the row's ``k``
    best lie in them: a chunk left out has ``k`` chunks ahead of it, each
    holding an entry at least as good and, at equal values, earlier), and
    run TopK over those ``k`` chunks in their original order, so ties still
    resolve to the lower index.

    With ``offsets`` ``[rows, m]``, ``x`` is ``[rows, m, n]`` and the result is
    that of ``x + offsets[:, :, None]`` flattened to ``[rows, m * n]``, without
    forming that sum: chunks divide ``n``, so each has one offset, added to its
    maximum (``max(x) + o == max(x + o)`` exactly, as rounding is monotonic)
    and to the ``k`` chunks picked, not to all ``m * n`` entries.
    """
    lead = tf.shape(x)[:-1] if offsets is None else tf.shape(x)[:1]
    m, n = (1, x.shape[-1]) if offsets is None else (x.shape[-2], x.shape[-1])
    size = _chunk_size(n)
    if size is None or k * size >= m * n:
        flat = x if offsets is None else tf.reshape(x + offsets[:, :, None], [-1, m * n])
        return tf.math.top_k(flat, k=k)
    per = n // size  # chunks per part
    maxima = tf.reduce_max(tf.reshape(x, [-1, m, per, size]), axis=-1)  # [rows, m, per]
    if offsets is not None:
        maxima = maxima + offsets[:, :, None]  # [rows, m, per]
    _, chunks = tf.math.top_k(tf.reshape(maxima, [-1, m * per]), k=k)  # [rows, k]
    chunks = tf.sort(chunks, axis=-1)  # original order: ties keep resolving to the lower index
    picked = tf.gather(tf.reshape(x, [-1, m * per, size]), chunks, batch_dims=1)  # [rows, k, size]
    if offsets is not None:
        picked = picked + tf.gather(offsets, chunks // per, batch_dims=1)[:, :, None]  # [rows, k, size]
    values, position = tf.math.top_k(tf.reshape(picked, [-1, k * size]), k=k)  # [rows, k]
    indices = tf.gather(chunks, position // size, batch_dims=1) * size + position % size
    out_shape = tf.concat([lead, [k]], 0)
    return tf.reshape(values, out_shape), tf.reshape(indices, out_shape)

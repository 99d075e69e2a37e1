"""Greedy decoding without a cache: the plain reference the cached greedy search is tested against.

Re-runs the whole decoder over a fixed-size buffer at every step (section 6.1's
maximum output length: input length + ``max_extra_length``).
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID


def reference_greedy(model, inputs, max_extra_length: int = 50, max_output_length: int | None = None, min_length=2):
    """Greedy translations of ``inputs`` (``int32[batch, src_len]``, EOS-terminated, 0-padded).

    Returns ``int32[batch, out_len]`` ids without BOS, each ending in EOS (or cut
    at the maximum length) and padded with 0; no EOS before ``min_length`` tokens
    (EOS counted). Stops as soon as every row has produced EOS.
    """
    inputs = tf.convert_to_tensor(inputs, tf.int32)
    batch = tf.shape(inputs)[0]
    source_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
    limit = tf.reduce_max(source_lengths) + max_extra_length
    if max_output_length is not None:
        limit = tf.minimum(limit, max_output_length)
    memory, memory_mask = model.encode(inputs, training=False)  # [batch, src_len, d_model]
    tokens = tf.concat([tf.fill([batch, 1], BOS_ID), tf.zeros([batch, limit], tf.int32)], axis=1)  # [batch, limit+1]
    finished = tf.zeros([batch], tf.bool)

    def not_done(step, tokens, finished):
        return tf.logical_and(step < limit, tf.logical_not(tf.reduce_all(finished)))

    def body(step, tokens, finished):
        logits = model.decode(tokens[:, :-1], memory, memory_mask, training=False)  # [batch, limit, vocab]
        banned = tf.one_hot([PAD_ID, BOS_ID], tf.shape(logits)[-1], on_value=-1e9, off_value=0.0)  # never outputs
        eos = tf.one_hot(EOS_ID, tf.shape(logits)[-1], on_value=-1e9, off_value=0.0) * tf.cast(
            step + 1 < min_length, tf.float32
        )
        next_id = tf.cast(tf.argmax(logits[:, step] + tf.reduce_sum(banned, 0) + eos, axis=-1), tf.int32)  # [batch]
        per_row_limit = source_lengths + max_extra_length
        next_id = tf.where(finished, PAD_ID, next_id)
        next_id = tf.where(tf.logical_and(~finished, step + 1 >= per_row_limit), EOS_ID, next_id)
        column = tf.one_hot(step + 1, limit + 1, dtype=tf.int32)[None, :]  # [1, limit+1]
        tokens = tokens + column * next_id[:, None]
        return step + 1, tokens, tf.logical_or(finished, next_id == EOS_ID)

    _, tokens, _ = tf.while_loop(not_done, body, (tf.constant(0), tokens, finished))
    return tokens[:, 1:]

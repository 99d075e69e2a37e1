"""Greedy search: the most probable next token at every step, over the decoding cache.

The cheapest decoding mode, for dev BLEU during training. It is not beam
search with one beam: beam search with a length penalty (α > 0) may keep a
live hypothesis over a finished one; greedy search ends a sentence at its first
EOS. Section 6.1's maximum output length applies: input length + ``max_extra_length``.
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.inference.incremental import IncrementalDecoder


def greedy_search(model, inputs, max_extra_length: int = 50, max_output_length: int | None = None, decoding=None):
    """Greedy translations of ``inputs`` (``int32[batch, src_len]``, EOS-terminated, 0-padded).

    Args:
      model: a :class:`~tf_transformer.model.Transformer`.
      inputs: source ids.
      max_extra_length: each row may produce at most its source length + this many tokens (EOS counted).
      max_output_length: an absolute cap on the output length besides that.
      decoding: an :class:`~tf_transformer.inference.incremental.IncrementalDecoder`
        of ``model`` to reuse (one is made by default).

    Returns:
      ``int32[batch, out_len]`` ids without BOS, each ending in EOS (forced at
      its maximum length) and padded with 0. PAD and BOS are never chosen.
      Stops as soon as every row has produced EOS.
    """
    decoding = decoding or IncrementalDecoder(model)
    inputs = tf.convert_to_tensor(inputs, tf.int32)
    batch = tf.shape(inputs)[0]
    max_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1) + max_extra_length  # [batch]
    if max_output_length is not None:
        max_lengths = tf.minimum(max_lengths, max_output_length)
    limit = tf.reduce_max(max_lengths)
    memory, memory_mask = decoding.encode(inputs)  # [batch, src_len, d_model]
    constants = decoding.constants(memory, memory_mask=memory_mask)
    cache = decoding.empty_cache(batch, limit, memory.dtype, beam_size=1)

    def choose(logits, step, finished):
        """The next token of every row at ``step``, from ``logits`` ``[batch, vocab]``."""
        banned = tf.reduce_sum(tf.one_hot([PAD_ID, BOS_ID], tf.shape(logits)[-1], on_value=-1e9), 0)  # [vocab]
        token = tf.argmax(tf.cast(logits, tf.float32) + banned, axis=-1, output_type=tf.int32)  # [batch]
        token = tf.where(step + 1 >= max_lengths, EOS_ID, token)  # a row at its maximum length ends
        return tf.where(finished, PAD_ID, token)  # [batch]

    def write(tokens, step, token):
        return tokens + tf.one_hot(step, limit, dtype=tf.int32)[None, :] * token[:, None]  # [batch, limit]

    logits, cache = decoding.first_step(tf.fill([batch], BOS_ID), cache, constants, memory_mask)  # [batch, vocab]
    token = choose(logits, 0, tf.zeros([batch], tf.bool))  # [batch]
    tokens = write(tf.zeros([batch, limit], tf.int32), 0, token)  # [batch, limit]

    def not_done(step, token, tokens, finished, cache):
        return tf.logical_and(step < limit, tf.logical_not(tf.reduce_all(finished)))

    def body(step, token, tokens, finished, cache):
        logits, cache = decoding.step(token, cache, constants, memory_mask, step)  # [batch, vocab]
        chosen = choose(logits, step, finished)
        chosen.set_shape(token.shape)  # the batch as known on entry (1 for one sentence traced alone)
        token = chosen
        return step + 1, token, write(tokens, step, token), finished | (token == EOS_ID), cache

    _, _, tokens, _, _ = tf.while_loop(
        not_done, body, (tf.constant(1), token, tokens, token == EOS_ID, cache), maximum_iterations=limit
    )
    return tokens

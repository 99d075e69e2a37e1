"""Searches without a cache: the plain references the cached searches are tested against.

Each re-runs the whole decoder (the model's own ``decode``, teacher-forced over
the prefix) at every step: :func:`reference_greedy` over a fixed-size buffer
(section 6.1's maximum output length: input length + ``max_extra_length``),
:func:`reference_beam_search` inside the same beam search as the translator's.
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.request import DecodeRequest


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


def reference_beam_search(translator, inputs):
    """``translator.search(inputs)`` of one batch with every beam running the whole decoder at every step.

    The same :func:`~tf_transformer.decoding.beam_search.beam_search` and
    limits as :meth:`~tf_transformer.inference.translator.Translator.search`
    (the translator's options; no prefix, no tree constraint), but no cache:
    each step decodes every hypothesis's whole prefix with ``model.decode``.
    Returns ``(ids int32[batch, beam, out_len], scores float32[batch, beam], steps)``.
    """
    model, options = translator.model, translator.options
    request = DecodeRequest().resolved(options)
    beam_size = request.beam_size
    inputs = tf.convert_to_tensor(inputs, tf.int32)
    batch = tf.shape(inputs)[0]
    source_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
    max_lengths = options.longest_output(source_lengths, request, None, tf.minimum, tf.maximum)  # [batch]
    max_length = tf.reduce_max(max_lengths)
    memory, memory_mask = model.encode(inputs, training=False)  # [batch, src_len, d_model]
    memory = tf.repeat(memory, beam_size, axis=0)  # [batch * beam, src_len, d_model]
    memory_mask = tf.repeat(memory_mask, beam_size, axis=0)  # [batch * beam, 1, 1, src_len]

    def step_fn(ids, cache, step):
        position = tf.one_hot(step, max_length, dtype=tf.int32)[None, :]  # [1, max_len]
        prefix = cache["prefix"] * (1 - position) + ids[:, None] * position  # [batch * beam, max_len]
        logits = model.decode(prefix, memory, memory_mask, training=False)  # [batch * beam, max_len, vocab]
        return tf.nn.log_softmax(logits[:, step], axis=-1), {"prefix": prefix}

    return beam_search(
        step_fn,
        {"prefix": tf.zeros([batch * beam_size, max_length], tf.int32)},
        batch,
        max_lengths,
        beam_size=beam_size,
        alpha=request.alpha,
        min_length=request.min_length,
        early_stop=options.early_stop,
    )

"""One hypothesis per sentence: greedy search, and the loop sampling shares with it.

Greedy search is the cheapest decoding mode, for dev BLEU during training. It is
not beam search with one beam: beam search with a length penalty (α > 0) may
keep a live hypothesis over a finished one; greedy search ends a sentence at its
first EOS. Section 6.1's maximum output length applies: input length +
``max_extra_length``. :func:`single_search` is the loop, over the decoding
cache, with the choice of each next token left to its caller: the most probable
(:func:`greedy_search`) or a draw (:mod:`tf_transformer.decoding.sampling`).
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding import cached_attention
from tf_transformer.decoding.beam_search import NEG_INF
from tf_transformer.decoding.incremental import IncrementalDecoder


def single_search(
    model,
    inputs,
    choose,
    max_extra_length=50,
    max_output_length: int | None = None,
    min_length=2,
    decoding=None,
    weights=None,
    constraint=None,
):
    """One output per row of ``inputs`` (``int32[batch, src_len]``, EOS-terminated, 0-padded), token by token.

    Args:
      model: a :class:`~tf_transformer.model.Transformer`.
      inputs: source ids.
      choose: ``(log_probs float32[batch, vocab], step) → int32[batch]``, each
        row's next token; ``log_probs`` are the model's with PAD and BOS (and EOS
        before ``min_length``) set to ``NEG_INF``.
      max_extra_length: each row may produce at most its source length + this many tokens (EOS counted).
      max_output_length: an absolute cap on the output length besides that.
      min_length: no EOS before this many output tokens (EOS counted); the default
        2 keeps EOS from coming first, so a non-empty source never gets an empty output.
      decoding: an :class:`~tf_transformer.decoding.incremental.IncrementalDecoder`
        of ``model`` to reuse (one is made by default).
      weights: the decoder's kernels laid out for decoding, if kept (``Translator.frozen_weights``).
      constraint: optional :class:`~tf_transformer.decoding.beam_search.Constraint`: ``choose``
        sees the tokens it does not allow at ``NEG_INF`` (what it reads of each row: its
        ``read_input(inputs)``).

    Returns:
      ``(ids int32[batch, out_len], log_probs float32[batch])``: ids without BOS,
      each ending in EOS (forced at its maximum length) and padded with 0, and
      the model's log-probability of each output (the sum over its tokens, EOS
      included). Stops as soon as every row has produced EOS.
    """
    decoding = decoding or IncrementalDecoder(model)
    inputs = tf.convert_to_tensor(inputs, tf.int32)
    batch = tf.shape(inputs)[0]
    constraint_inputs = () if constraint is None else constraint.read_input(inputs)  # [batch, ...]
    max_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1) + max_extra_length  # [batch]
    if max_output_length is not None:
        max_lengths = tf.minimum(max_lengths, max_output_length)
    max_lengths = tf.maximum(max_lengths, min_length)
    limit = tf.reduce_max(max_lengths)
    memory, memory_mask = decoding.encode(inputs)  # [batch, src_len, d_model]
    constants = decoding.constants(memory, weights, memory_mask)
    cache = decoding.empty_cache(batch, limit, memory.dtype, beam_size=1)

    def next_token(logits, step, finished, rules):
        """Every row's token at ``step``, its log-probability and the constraint's state after it,
        from ``logits`` ``[batch, vocab]``."""
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)  # [batch, vocab]
        if constraint is not None:
            log_probs = constraint.constrain(log_probs[:, None], rules, constraint_inputs, step, max_lengths)[:, 0]
        vocab = tf.range(tf.shape(log_probs)[-1])  # [vocab]
        banned = (vocab == PAD_ID) | (vocab == BOS_ID) | ((vocab == EOS_ID) & (step + 1 < min_length))
        token = choose(tf.where(banned, NEG_INF, log_probs), step)  # [batch]
        if constraint is not None:  # a row the constraint allows nothing (an empty source) ends
            token = tf.where(tf.reduce_all(banned | (log_probs <= NEG_INF / 2), axis=-1), EOS_ID, token)
        token = tf.where(step + 1 >= max_lengths, EOS_ID, token)  # a row at its maximum length ends
        token = tf.where(finished, PAD_ID, token)  # [batch]
        if constraint is not None:
            rules = constraint.advance(rules, token[:, None])  # [batch, 1, ...]
        return token, tf.where(finished, 0.0, tf.gather(log_probs, token, batch_dims=1)), rules

    def write(tokens, step, token):
        return tokens + tf.one_hot(step, limit, dtype=tf.int32)[None, :] * token[:, None]  # [batch, limit]

    rules = () if constraint is None else constraint.start(batch, 1, limit + 1)  # [batch, 1, ...]
    logits, cache = decoding.first_step(tf.fill([batch], BOS_ID), cache, constants, memory_mask)  # [batch, vocab]
    token, total, rules = next_token(logits, 0, tf.zeros([batch], tf.bool), rules)  # [batch], [batch]
    tokens = write(tf.zeros([batch, limit], tf.int32), 0, token)  # [batch, limit]

    def not_done(step, token, tokens, total, finished, cache, rules):
        return tf.logical_and(step < limit, tf.logical_not(tf.reduce_all(finished)))

    def body(step, token, tokens, total, finished, cache, rules):
        logits, cache = decoding.step(token, cache, constants, memory_mask, step)  # [batch, vocab]
        chosen, log_prob, rules_after = next_token(logits, step, finished, rules)
        chosen.set_shape(token.shape)  # the batch as known on entry (1 for one sentence traced alone)
        log_prob.set_shape(total.shape)
        tf.nest.map_structure(lambda after, before: after.set_shape(before.shape), rules_after, rules)
        finished_now = finished | (chosen == EOS_ID)
        return step + 1, chosen, write(tokens, step, chosen), total + log_prob, finished_now, cache, rules_after

    def run():
        return tf.while_loop(
            not_done,
            body,
            (tf.constant(1), token, tokens, total, token == EOS_ID, cache, rules),
            maximum_iterations=limit,
        )

    # Every step computes the whole batch: the step's products are chosen once, not at every step.
    _, _, tokens, total, _, _, _ = cached_attention.products_by_rows(batch, run)
    return tokens, total


def greedy_search(
    model,
    inputs,
    max_extra_length: int = 50,
    max_output_length: int | None = None,
    min_length=2,
    decoding=None,
    constraint=None,
):
    """Greedy translations of ``inputs``: :func:`single_search`'s ids, choosing the most probable token.

    ``constraint``: optional, a :class:`~tf_transformer.decoding.beam_search.Constraint` with a
    ``read_input(inputs)`` (a parser's :class:`~tf_transformer.decoding.tree_constraint.TreeConstraint`).

    Returns ``int32[batch, out_len]`` ids without BOS, each ending in EOS and padded with 0.
    """

    def most_probable(log_probs, step):
        return tf.argmax(log_probs, axis=-1, output_type=tf.int32)  # [batch]

    ids, _ = single_search(
        model, inputs, most_probable, max_extra_length, max_output_length, min_length, decoding, constraint=constraint
    )
    return ids

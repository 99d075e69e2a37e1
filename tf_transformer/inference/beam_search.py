"""Beam search for translation (section 6.1), in one ``tf.while_loop``.

"We used beam search with a beam size of 4 and length penalty α = 0.6 … We set
the maximum output length during inference to input length + 50, but terminate
early when possible." Batch and beam are flattened to ``[batch * beam]`` for the
model; the decoder cache has fixed shapes, so the loop runs under XLA too.
Only stock TensorFlow ops: the graph can be served by TF Serving.
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.inference.xla import in_xla

NEG_INF = -1.0e9


def length_penalty(length, alpha: float):
    """GNMT's ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _flatten(x):
    """[batch, beam, ...] → [batch * beam, ...]."""
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def _unflatten(x, batch, beam):
    """[batch * beam, ...] → [batch, beam, ...]."""
    return tf.reshape(x, tf.concat([[batch, beam], tf.shape(x)[1:]], 0))


def _gather_beams(tree, indices, batch, beam_in):
    """Picks beams ``indices`` ([batch, k]) from every [batch * beam_in, ...] (flat) tensor of ``tree``."""

    def gather(x):
        gathered = _flatten(tf.gather(_unflatten(x, batch, beam_in), indices, batch_dims=1))
        gathered.set_shape(x.shape)  # same K beams in and out: keep static shapes for the while loop
        return gathered

    return tf.nest.map_structure(gather, tree)


def _chunk_size(vocab) -> int | None:
    """A divisor of ``vocab`` to split rows into for :func:`top_k_rows` (None: not worth it)."""
    if vocab is None or vocab < 1024:
        return None
    for size in range(64, 16, -1):  # chunks of 17..64 entries
        if vocab % size == 0:
            return size
    return None


def _head_width(vocab) -> int | None:
    """The least divisor of ``vocab`` above every banned id (PAD, BOS, EOS), if at most 64."""
    if not isinstance(vocab, int):
        return None
    for width in range(max(PAD_ID, BOS_ID, EOS_ID) + 1, 65):
        if vocab % width == 0:
            return width
    return None


def ban_tokens(candidates, eos_banned):
    """``candidates`` ``[batch, K, vocab]`` with PAD and BOS, and EOS where ``eos_banned``, set to ``NEG_INF``.

    The banned ids are the vocabulary's first few, so each hypothesis's row is
    viewed as rows of ``width`` entries (:func:`_head_width`) and only its first
    is rewritten, with ``InplaceUpdate``: a few values per hypothesis instead of
    a select or bias add over all ``[batch, K, vocab]`` entries. The kernel
    writes into ``candidates``' buffer when nothing else holds it (a step's
    log-probabilities inside the search) and copies it otherwise. Under XLA (no
    ``InplaceUpdate`` kernel), or when no such width divides the vocabulary, a select.
    """
    width = None if in_xla() else _head_width(candidates.shape[-1])
    tokens = tf.range(width or tf.shape(candidates)[-1])  # [width] or [vocab]
    banned = (tokens == PAD_ID) | (tokens == BOS_ID) | ((tokens == EOS_ID) & eos_banned)
    if width is None:
        return tf.where(banned, NEG_INF, candidates)  # [batch, K, vocab]
    shape = tf.shape(candidates)
    heads = tf.reshape(candidates, [-1, width])  # [batch * K * vocab / width, width]
    rows = tf.range(shape[0] * shape[1]) * (candidates.shape[-1] // width)  # [batch * K]: each one's first ids
    first = tf.gather(heads, rows)  # [batch * K, width]
    heads = tf.raw_ops.InplaceUpdate(x=heads, i=rows, v=tf.where(banned, NEG_INF, first))
    return tf.reshape(heads, shape)  # [batch, K, vocab]


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


def top_continuations(log_probs, live_log_probs, step, min_length, max_lengths):
    """The ``2K`` best continuations of each sentence's ``K`` beams: ``(log_probs, indices)`` ``[batch, 2K]``.

    ``log_probs`` ``[batch, K, vocab]`` of each beam's next token, ``live_log_probs``
    ``[batch, K]`` the beams' own; a continuation's index is ``beam * vocab +
    token``, best first, ties to the lower beam, then the lower token. Padding
    and BOS never come next, nor EOS before ``min_length``; a row at its
    ``max_lengths`` may only end. A banned continuation scores ``NEG_INF`` (plus
    its beam's score): it is picked only where fewer than ``2K`` are allowed (a
    beam never alive, or a row that must end), and the caller treats it as dead.
    ``log_probs`` is rewritten in place (see :func:`ban_tokens`).
    """
    batch, k = tf.shape(log_probs)[0], live_log_probs.shape[1]
    vocab = log_probs.shape[-1]  # static when the model's is: constant index arithmetic below
    if vocab is None:
        vocab = tf.shape(log_probs)[-1]
    # A row at its maximum length may only end: its beams' EOS, best first (ties to the
    # lower beam), then banned ones (PAD of beam 0), from K values instead of a
    # vocabulary-wide mask. Read before ban_tokens rewrites log_probs in place.
    eos_log_probs = log_probs[:, :, EOS_ID] + live_log_probs  # [batch, K], as the sums below
    with tf.control_dependencies([eos_log_probs]):
        allowed = ban_tokens(log_probs, step + 1 < min_length)  # [batch, K, vocab]
    # One top-k per sentence over its K * vocab sums (top_k_rows, in chunks, the beams'
    # scores added to the chunks' maxima and the picked chunks only). Cheaper than a
    # top-k per beam followed by one over the K * 2K picks, which were twice the TopK
    # calls on four times the rows (same picks, same order).
    if isinstance(vocab, int):
        top = min(2 * k, k * vocab)
        top_log_probs, top_index = top_k_rows(allowed, top, offsets=live_log_probs)  # [batch, 2K]
    else:  # vocabulary size known only when running
        top = tf.minimum(2 * k, k * vocab)
        flat = tf.reshape(allowed + live_log_probs[:, :, None], [batch, k * vocab])  # [batch, K*vocab]
        top_log_probs, top_index = tf.math.top_k(flat, k=top)  # [batch, 2K]
    end_log_probs, end_pick = tf.math.top_k(
        tf.concat([eos_log_probs, tf.fill([batch, top - k], NEG_INF)], axis=1), k=top
    )  # [batch, 2K]
    end_index = tf.where(end_pick < k, end_pick * vocab + EOS_ID, PAD_ID)  # [batch, 2K]
    must_end = (step + 1 >= max_lengths)[:, None]  # [batch, 1]
    return tf.where(must_end, end_log_probs, top_log_probs), tf.where(must_end, end_index, top_index)


def beam_search(
    step_fn,
    initial_cache,
    batch_size,
    max_lengths,
    beam_size: int = 4,
    alpha: float = 0.6,
    vocab_size=None,
    reorder_cache=None,
    min_length=0,
    first_step_fn=None,
):
    """Finds the ``beam_size`` best continuations of BOS for each batch row.

    Args:
      step_fn: ``(ids [batch*beam], cache, step) → (log_probs [batch*beam, vocab], cache)``;
        ``step`` is the position of ``ids`` (0 for BOS).
      initial_cache: nested ``[batch*beam, ...]`` tensors (beams already tiled).
      batch_size: scalar.
      max_lengths: ``int32[batch]``: most tokens (EOS included) each row may produce.
      beam_size: K. One beam with α > 0 is not greedy search: a finished hypothesis can
        lose to a longer live one (greedy search: :mod:`tf_transformer.inference.greedy`).
      alpha: length penalty exponent; 0 disables it.
      min_length: no EOS before this many output tokens (EOS counted).
      reorder_cache: ``(cache, beams int32[batch, K]) → cache`` where beam ``k``
        of row ``b`` continues beam ``beams[b, k]``; by default every cache
        tensor is gathered along its ``[batch*beam]`` axis. A model whose cache
        can move less (the Transformer decoder moves only an index) passes its own.
      first_step_fn: optional ``(ids [batch], cache) → (log_probs [batch, vocab],
        cache)`` for step 0 with one row per sentence: every beam of a sentence
        starts from BOS with the same empty cache and only the first is alive,
        so ``step_fn`` on all ``batch*beam`` rows would compute the same row
        ``beam`` times. The cache it returns must hold what ``step_fn`` would
        have written for beam 0 of each sentence, which every hypothesis
        continues after step 0 (``reorder_cache`` then copies it to all).
        Without it, step 0 runs ``step_fn`` like every other step.

    Returns:
      ``(ids int32[batch, beam, length], scores float32[batch, beam], steps)``:
      hypotheses best first, without BOS, padded with 0 after EOS; scores are
      log-probabilities divided by the length penalty; ``steps`` is the number
      of decoding steps run (fewer than the maximum when every row stopped early).
    """
    batch, k = batch_size, beam_size
    if reorder_cache is None:

        def reorder_cache(cache, beams):
            return _gather_beams(cache, beams, batch, k)

    max_length = tf.reduce_max(max_lengths)
    # State. Sequences hold BOS at position 0 and the token chosen at step i at i + 1.
    live_ids = tf.concat(
        [tf.fill([batch, k, 1], BOS_ID), tf.zeros([batch, k, max_length], tf.int32)], axis=2
    )  # [batch, K, max_length + 1]
    live_log_probs = tf.tile(
        tf.constant([[0.0] + [NEG_INF] * (beam_size - 1)]), [batch, 1]
    )  # [batch, K]: only the first beam is alive at the start
    finished_ids = tf.zeros_like(live_ids)  # [batch, K, max_length + 1]
    finished_scores = tf.fill([batch, k], NEG_INF)  # [batch, K]
    finished_flags = tf.zeros([batch, k], tf.bool)  # [batch, K]
    best_possible_penalty = length_penalty(max_lengths, alpha)  # [batch]

    def not_done(step, live_ids, live_log_probs, finished_ids, finished_scores, finished_flags, cache):
        # A live beam's score can only fall as it grows: its best possible final
        # score is its log-prob now divided by the largest penalty it can reach.
        best_live = live_log_probs[:, 0] / best_possible_penalty  # [batch]
        worst_finished = tf.reduce_min(tf.where(finished_flags, finished_scores, -NEG_INF), axis=1)  # [batch]
        row_done = tf.logical_and(tf.reduce_all(finished_flags, axis=1), worst_finished >= best_live)
        row_done = tf.logical_or(row_done, step >= max_lengths)
        return tf.logical_and(step < max_length, tf.logical_not(tf.reduce_all(row_done)))

    def advance(log_probs, step, live_ids, live_log_probs, finished_ids, finished_scores, finished_flags, cache):
        """The state after step ``step``, from its ``log_probs`` ``[batch, K, vocab]``."""
        vocab = log_probs.shape[-1]  # static when the model's is: constant index arithmetic below
        if vocab is None:
            vocab = tf.shape(log_probs)[-1]
        top_log_probs, top_index = top_continuations(log_probs, live_log_probs, step, min_length, max_lengths)
        top_beam = top_index // vocab  # [batch, 2K]
        top_token = top_index % vocab  # [batch, 2K]
        top_ids = tf.gather(live_ids, top_beam, batch_dims=1)  # [batch, 2K, max_length + 1]
        position = tf.one_hot(step + 1, max_length + 1, dtype=tf.int32)  # [max_length + 1]
        top_ids = top_ids + position[None, None, :] * top_token[:, :, None]
        top_is_eos = tf.equal(top_token, EOS_ID)  # [batch, 2K]
        dead = top_log_probs <= NEG_INF / 2  # continuations of beams that were never alive

        # Live: the K best that did not just end.
        live_candidates = tf.where(top_is_eos | dead, NEG_INF, top_log_probs)  # [batch, 2K]
        live_log_probs, live_pick = tf.math.top_k(live_candidates, k=k)  # [batch, K]
        live_ids = tf.gather(top_ids, live_pick, batch_dims=1)  # [batch, K, max_length + 1]
        source_beam = tf.gather(top_beam, live_pick, batch_dims=1)  # [batch, K]
        cache = reorder_cache(cache, source_beam)

        # Finished: merge those that just ended (scored with the length penalty) into the K best.
        new_scores = top_log_probs / length_penalty(step + 1, alpha)  # [batch, 2K]
        new_scores = tf.where(top_is_eos & ~dead, new_scores, NEG_INF)
        all_ids = tf.concat([finished_ids, top_ids], axis=1)  # [batch, 3K, max_length + 1]
        all_scores = tf.concat([finished_scores, new_scores], axis=1)  # [batch, 3K]
        all_flags = tf.concat([finished_flags, top_is_eos & ~dead], axis=1)  # [batch, 3K]
        finished_scores, pick = tf.math.top_k(all_scores, k=k)  # [batch, K]
        finished_ids = tf.gather(all_ids, pick, batch_dims=1)
        finished_flags = tf.gather(all_flags, pick, batch_dims=1)
        return step + 1, live_ids, live_log_probs, finished_ids, finished_scores, finished_flags, cache

    def body(step, live_ids, live_log_probs, finished_ids, finished_scores, finished_flags, cache):
        ids = _flatten(live_ids[:, :, step])  # [batch*K]
        log_probs, cache = step_fn(ids, cache, step)  # [batch*K, vocab]
        log_probs = _unflatten(log_probs, batch, k)  # [batch, K, vocab]
        return advance(log_probs, step, live_ids, live_log_probs, finished_ids, finished_scores, finished_flags, cache)

    state = (tf.constant(0), live_ids, live_log_probs, finished_ids, finished_scores, finished_flags, initial_cache)
    iterations = max_length
    if first_step_fn is not None:
        # Step 0 once per sentence; its row stands for every beam (only the first is alive).
        first_log_probs, cache = first_step_fn(live_ids[:, 0, 0], initial_cache)  # [batch, vocab]
        log_probs = tf.tile(first_log_probs[:, None, :], [1, k, 1])  # [batch, K, vocab]
        state = advance(log_probs, *state[:-1], cache)
        iterations = tf.maximum(max_length - 1, 0)
    step, live_ids, live_log_probs, finished_ids, finished_scores, finished_flags, _ = tf.while_loop(
        not_done, body, state, maximum_iterations=iterations
    )
    # Finished hypotheses first, then live ones (only when fewer than K finished).
    live_scores = live_log_probs / length_penalty(step, alpha)  # [batch, K]
    all_ids = tf.concat([finished_ids, live_ids], axis=1)[:, :, 1:]  # [batch, 2K, max_length]
    all_scores = tf.concat([tf.where(finished_flags, finished_scores, NEG_INF), live_scores], axis=1)  # [batch, 2K]
    rank = all_scores - tf.concat([tf.zeros([batch, k]), tf.fill([batch, k], 1e5)], axis=1)  # finished first
    _, pick = tf.math.top_k(rank, k=k)  # [batch, K]
    ids = tf.gather(all_ids, pick, batch_dims=1)  # [batch, K, max_length]
    scores = tf.gather(all_scores, pick, batch_dims=1)  # [batch, K]
    # Clear everything after the first EOS.
    ended = tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=2, exclusive=True) > 0
    ids = tf.where(ended, 0, ids)
    return ids, scores, step

"""Beam search for translation (section 6.1), in one ``tf.while_loop``.

"We used beam search with a beam size of 4 and length penalty α = 0.6 … We set
the maximum output length during inference to input length + 50, but terminate
early when possible." The paper does not say when that is; :data:`EARLY_STOPS`
are the two rules offered (docs/design/decoding.md compares them). Batch and beam
are flattened to ``[batch * beam]`` for the model; the decoder cache has fixed
shapes, so the loop runs under XLA too. Only stock TensorFlow ops: the graph can
be served by TF Serving.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from configs.decoding import EARLY_STOPS
from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding.top_k import top_k_rows
from tf_transformer.decoding.xla import in_xla

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


def force_prefix(log_probs, forced_ids, step):
    """``log_probs`` ``[batch, K, vocab]`` where each row's next token is forced: all but that token ``NEG_INF``.

    ``forced_ids`` ``int32[batch, prefix_len]``, 0-padded: row ``b`` must choose
    ``forced_ids[b, step]`` at ``step`` while that is not padding. The forced
    token keeps the model's log-probability, so a hypothesis's score is the
    model's log-probability of the whole output, prefix included. Rows past
    their prefix, and every step past the longest, are left as they are (a
    ``tf.cond``: no vocabulary-wide select after the prefixes).
    """
    prefix_length = tf.shape(forced_ids)[1]

    def force():
        token = tf.gather(forced_ids, tf.minimum(step, prefix_length - 1), axis=1)  # [batch]
        forcing = (step < prefix_length) & (token != PAD_ID)  # [batch]
        keep = tf.one_hot(token, tf.shape(log_probs)[-1], on_value=True, off_value=False)  # [batch, vocab]
        return tf.where(forcing[:, None, None] & ~keep[:, None, :], NEG_INF, log_probs)  # [batch, K, vocab]

    return tf.cond(step < prefix_length, force, lambda: tf.identity(log_probs))


class BeamState(NamedTuple):
    """The loop state of :func:`beam_search`: K live and K finished hypotheses per sentence.

    Sequences hold BOS at position 0 and the token chosen at step ``i`` at ``i + 1``;
    ``length`` below is the longest output any sentence of the batch may have.

    Fields:
      step: ``int32[]``, the position of the tokens the next step reads (0: BOS).
      live_ids: ``int32[batch, K, length + 1]``, the live hypotheses, best first.
      live_log_probs: ``float32[batch, K]``, their log-probabilities (``NEG_INF``: not alive).
      finished_ids: ``int32[batch, K, length + 1]``, the best hypotheses that ended in EOS.
      finished_scores: ``float32[batch, K]``, their log-probabilities divided by the length penalty.
      finished_flags: ``bool[batch, K]``, whether each finished slot holds a hypothesis.
      ended: ``int32[batch]``, how many hypotheses ended among the K best continuations of their steps.
      best_ended: ``bool[batch]``, the best continuation of some step ended (OpenNMT-py's "top beam finished").
      done: ``bool[batch]``, the sentence's search has ended (:func:`sentence_done`): its hypotheses
        are final, and its continuations count as dead.
      cache: the decoder's cache, nested ``[batch * K, ...]`` tensors as ``step_fn`` keeps them.
      constraint: each live hypothesis's state under a :class:`Constraint`, nested ``[batch, K, ...]``
        tensors (``()`` without one).
    """

    step: Any
    live_ids: Any
    live_log_probs: Any
    finished_ids: Any
    finished_scores: Any
    finished_flags: Any
    ended: Any
    best_ended: Any
    done: Any
    cache: Any
    constraint: Any = ()


class Constraint:
    """Which tokens each hypothesis may write next (a parser's: those that keep its output a tree).

    A search keeps one state per hypothesis (nested ``[batch, K, ...]`` tensors, ``K``
    1 for a search without beams) that moves with its beam, and reads what the rules
    need of each sentence from its ``inputs`` (nested ``[batch, ...]``, given with
    :meth:`read_input`). Tokens not allowed score ``NEG_INF`` (:meth:`constrain`).
    The rules must leave every hypothesis a way to end by its maximum length (EOS
    allowed there). Implemented by
    :class:`~tf_transformer.decoding.tree_constraint.TreeConstraint`.
    """

    def read_input(self, source_ids):
        """What the rules read of each sentence (nested ``[batch, ...]``), from its source ids
        ``int32[batch, src_len]`` (EOS-terminated, 0-padded)."""
        raise NotImplementedError

    def start(self, batch, beams: int, length):
        """The state of every hypothesis before its first token (``length``: the longest output)."""
        raise NotImplementedError

    def constrain(self, log_probs, state, inputs, step, max_lengths):
        """The model's ``log_probs`` ``[batch, K, vocab]`` as the search scores what each hypothesis
        may write at ``step``: ``NEG_INF`` for what it may not."""
        raise NotImplementedError

    def advance(self, state, tokens):
        """The state after each hypothesis wrote ``tokens`` ``int32[batch, K]`` (EOS, padding: unchanged)."""
        raise NotImplementedError


def initial_state(batch, beam_size: int, length, cache, constraint=()) -> BeamState:
    """Every sentence at BOS, with only its first beam alive and nothing finished."""
    k = beam_size
    live_ids = tf.concat(
        [tf.fill([batch, k, 1], BOS_ID), tf.zeros([batch, k, length], tf.int32)], axis=2
    )  # [batch, K, length + 1]
    return BeamState(
        step=tf.constant(0),
        live_ids=live_ids,
        live_log_probs=tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1]),  # [batch, K]
        finished_ids=tf.zeros_like(live_ids),  # [batch, K, length + 1]
        finished_scores=tf.fill([batch, k], NEG_INF),  # [batch, K]
        finished_flags=tf.zeros([batch, k], tf.bool),  # [batch, K]
        ended=tf.zeros([batch], tf.int32),  # [batch]
        best_ended=tf.zeros([batch], tf.bool),  # [batch]
        done=tf.zeros([batch], tf.bool),  # [batch]
        cache=cache,
        constraint=constraint,
    )


def sentence_done(state: BeamState, early_stop: str, max_lengths, best_possible_penalty, min_finished=1):
    """``bool[batch]``: whether each sentence's search has ended after step ``state.step - 1``.

    Every sentence ends at its ``max_lengths``, and once its K finished hypotheses
    all beat the best final score any live beam could still reach (the exact
    bound). A live beam's score can only fall as it grows, so that is its
    log-probability now divided by the largest penalty it can reach
    (``best_possible_penalty`` ``[batch]``, at the sentence's ``max_lengths``).
    With ``early_stop="finished"`` (:data:`EARLY_STOPS`) it also ends once K
    hypotheses ended among the K best continuations of their steps
    (``state.ended``); with ``early_stop="best"``, once the best continuation
    of a step ended and ``min_finished`` hypotheses (the n-best asked) did.
    Where the bound comes first, going on could not have changed its
    hypotheses, so it only saves steps. A sentence without a live
    hypothesis (all ended, or a constraint allowed nothing) ends at once.
    """
    k = state.finished_flags.shape[1]
    best_live = state.live_log_probs[:, 0] / best_possible_penalty  # [batch]
    worst_finished = tf.reduce_min(tf.where(state.finished_flags, state.finished_scores, -NEG_INF), axis=1)  # [batch]
    settled = tf.logical_and(tf.reduce_all(state.finished_flags, axis=1), worst_finished >= best_live)  # [batch]
    if early_stop == "finished":
        settled = settled | (state.ended >= k)
    elif early_stop == "best":
        finished = tf.reduce_sum(tf.cast(state.finished_flags, tf.int32), axis=1)  # [batch]
        settled = settled | (state.best_ended & (finished >= min_finished))
    hopeless = state.live_log_probs[:, 0] <= NEG_INF / 2  # [batch]: no live hypothesis, nothing can change
    return state.done | settled | hopeless | (state.step >= max_lengths)


def still_searching(state: BeamState, length):
    """``bool[]``: some sentence's search goes on (``length``: the largest of the maximum lengths)."""
    return tf.logical_and(state.step < length, tf.logical_not(tf.reduce_all(state.done)))


class _Candidates(NamedTuple):
    """The ``2K`` best continuations of a sentence's beams at one step (see :func:`top_continuations`)."""

    log_probs: Any  # float32[batch, 2K]: the hypothesis's log-probability; NEG_INF / 2 or less: dead
    ids: Any  # int32[batch, 2K, length + 1]: the beam's sequence with the new token written
    beam: Any  # int32[batch, 2K]: the beam each continues
    ended: Any  # bool[batch, 2K]: the new token is EOS and the continuation is not dead
    dead: Any  # bool[batch, 2K]: continues a beam that was never alive, or a banned token


def expand(state: BeamState, log_probs, min_length, max_lengths, length) -> _Candidates:
    """The candidates of step ``state.step`` from its ``log_probs`` ``[batch, K, vocab]``.

    ``length``: the longest output of the batch (see :class:`BeamState`).
    """
    vocab = log_probs.shape[-1]  # static when the model's is: constant index arithmetic below
    if vocab is None:
        vocab = tf.shape(log_probs)[-1]
    top_log_probs, top_index = top_continuations(
        log_probs, state.live_log_probs, state.step, min_length, max_lengths
    )  # [batch, 2K]
    top_beam = top_index // vocab  # [batch, 2K]
    top_token = top_index % vocab  # [batch, 2K]
    top_ids = tf.gather(state.live_ids, top_beam, batch_dims=1)  # [batch, 2K, length + 1]
    position = tf.one_hot(state.step + 1, length + 1, dtype=tf.int32)  # [length + 1]
    top_ids = top_ids + position[None, None, :] * top_token[:, :, None]
    top_is_eos = tf.equal(top_token, EOS_ID)  # [batch, 2K]
    dead = top_log_probs <= NEG_INF / 2  # continuations of beams that were never alive
    dead = dead | state.done[:, None]  # a sentence whose search ended keeps its hypotheses as they are
    top_is_eos = top_is_eos & ~dead
    return _Candidates(top_log_probs, top_ids, top_beam, top_is_eos, dead)


def keep_live(
    state: BeamState, candidates: _Candidates, beam_size: int, reorder_cache, constraint: Constraint | None = None
) -> BeamState:
    """The K best candidates that did not just end become the live beams; the cache (and the
    ``constraint``'s state) follows them."""
    live_candidates = tf.where(candidates.ended | candidates.dead, NEG_INF, candidates.log_probs)  # [batch, 2K]
    live_log_probs, live_pick = tf.math.top_k(live_candidates, k=beam_size)  # [batch, K]
    live_ids = tf.gather(candidates.ids, live_pick, batch_dims=1)  # [batch, K, length + 1]
    # A sentence whose search ended keeps its live hypotheses as they were (they may fill its n-best).
    live_log_probs = tf.where(state.done[:, None], state.live_log_probs, live_log_probs)  # [batch, K]
    live_ids = tf.where(state.done[:, None, None], state.live_ids, live_ids)  # [batch, K, length + 1]
    source_beam = tf.gather(candidates.beam, live_pick, batch_dims=1)  # [batch, K]
    constrained = state.constraint
    if constraint is not None:
        followed = tf.nest.map_structure(lambda x: tf.gather(x, source_beam, batch_dims=1), state.constraint)
        constrained = constraint.advance(followed, live_ids[:, :, state.step + 1])  # [batch, K, ...]
    return state._replace(
        live_ids=live_ids,
        live_log_probs=live_log_probs,
        cache=reorder_cache(state.cache, source_beam),
        constraint=constrained,
    )


def keep_finished(state: BeamState, candidates: _Candidates, beam_size: int, alpha: float) -> BeamState:
    """Those that just ended, scored with the length penalty, merged into the K best finished hypotheses."""
    ended = candidates.ended  # [batch, 2K]
    new_scores = candidates.log_probs / length_penalty(state.step + 1, alpha)  # [batch, 2K]
    new_scores = tf.where(ended, new_scores, NEG_INF)
    all_ids = tf.concat([state.finished_ids, candidates.ids], axis=1)  # [batch, 3K, length + 1]
    all_scores = tf.concat([state.finished_scores, new_scores], axis=1)  # [batch, 3K]
    all_flags = tf.concat([state.finished_flags, ended], axis=1)  # [batch, 3K]
    finished_scores, pick = tf.math.top_k(all_scores, k=beam_size)  # [batch, K]
    return state._replace(
        finished_ids=tf.gather(all_ids, pick, batch_dims=1),
        finished_scores=finished_scores,
        finished_flags=tf.gather(all_flags, pick, batch_dims=1),
        ended=state.ended + tf.reduce_sum(tf.cast(ended[:, :beam_size], tf.int32), axis=1),  # the K best only
        best_ended=state.best_ended | ended[:, 0],
    )


def best_hypotheses(state: BeamState, beam_size: int, alpha: float):
    """``(ids int32[batch, K, length], scores float32[batch, K])`` when the search stops.

    Finished hypotheses first, best first, then live ones (only where fewer than K
    finished, scored with the penalty of their length; a beam that is not alive as
    ``NEG_INF`` and no tokens); without BOS, and padded with 0 after EOS.
    """
    k = beam_size
    batch = tf.shape(state.live_log_probs)[0]
    # A dead beam fills a slot as NEG_INF with no tokens: its score and ids must not depend on the
    # step the search stopped at (a sentence that left the loop early stops earlier).
    dead = state.live_log_probs <= NEG_INF / 2  # [batch, K]
    # Each scored with the penalty of its own length: a sentence's search may have ended before the loop's.
    lengths = tf.reduce_sum(tf.cast(state.live_ids[:, :, 1:] != PAD_ID, tf.int32), axis=2)  # [batch, K]
    live_scores = tf.where(dead, NEG_INF, state.live_log_probs / length_penalty(lengths, alpha))  # [batch, K]
    live_ids = tf.where(dead[:, :, None], 0, state.live_ids)  # [batch, K, length + 1]
    all_ids = tf.concat([state.finished_ids, live_ids], axis=1)[:, :, 1:]  # [batch, 2K, length]
    all_scores = tf.concat(
        [tf.where(state.finished_flags, state.finished_scores, NEG_INF), live_scores], axis=1
    )  # [batch, 2K]
    rank = all_scores - tf.concat([tf.zeros([batch, k]), tf.fill([batch, k], 1e5)], axis=1)  # finished first
    _, pick = tf.math.top_k(rank, k=k)  # [batch, K]
    ids = tf.gather(all_ids, pick, batch_dims=1)  # [batch, K, length]
    scores = tf.gather(all_scores, pick, batch_dims=1)  # [batch, K]
    # Clear everything after the first EOS.
    ended = tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=2, exclusive=True) > 0
    return tf.where(ended, 0, ids), scores


class Sentences(NamedTuple):
    """What :func:`beam_search` knows of each sentence it still searches, ``[batch, ...]`` each.

    Fields:
      rows: ``int32[batch]``, each sentence's row in the batch the search was given.
      max_lengths: ``int32[batch]``, the most tokens (EOS counted) it may produce.
      best_possible_penalty: ``float32[batch]``, the length penalty at ``max_lengths``.
      forced_ids: ``int32[batch, prefix_len]``, its target prefix (0-padded), or ``()`` without prefixes.
      constraint_inputs: what a :class:`Constraint` reads of it, nested ``[batch, ...]`` (``()``: none).
    """

    rows: Any
    max_lengths: Any
    best_possible_penalty: Any
    forced_ids: Any
    constraint_inputs: Any = ()


class Compaction(NamedTuple):
    """How a search drops sentences whose hypotheses are final from its cache (CTranslate2 does the same).

    Fields:
      select: ``(cache, keep int32[n], step) → cache`` of the sentences ``keep`` only,
        in that order (``step``: the position the next step writes).
      shapes: ``cache →`` the cache's static shapes with the sentences' axis unknown
        (the search loop's shape invariants).
      by_rows: optional ``(rows int32[], trace) → trace()``: the steps between two
        compactions all compute the same ``rows`` hypotheses, so a choice of the
        step's kernels by rows can be made once for them, around their loop
        (:func:`~tf_transformer.decoding.cached_attention.products_by_rows`).
    """

    select: Any
    shapes: Any
    by_rows: Any = None


def take_sentences(tree, rows, axis=0):
    """Every tensor of ``tree`` (sentences on ``axis``, first by default) at ``rows`` ``int32[n]``."""
    return tf.nest.map_structure(lambda x: tf.gather(x, rows, axis=axis), tree)


def unknown_sentences(tree, axis=0):
    """The static shapes of ``tree``'s tensors (sentences on ``axis``, first by default) with that axis unknown."""
    return tf.nest.map_structure(lambda x: tf.TensorShape([*x.shape[:axis], None, *x.shape[axis + 1 :]]), tree)


def compact(state: BeamState, sentences: Sentences, results, compaction: Compaction, alpha: float):
    """``(state, sentences, results)`` without the sentences that are done.

    Their hypotheses (:func:`best_hypotheses`) are written into ``results``
    (``(ids int32[batch, K, length], scores float32[batch, K])`` of the whole batch,
    at their ``rows``), and the search goes on with the others only.
    """
    k = state.live_log_probs.shape[1]
    keep = tf.cast(tf.where(~state.done)[:, 0], tf.int32)  # [n]
    leave = tf.cast(tf.where(state.done)[:, 0], tf.int32)  # [batch - n]
    fields = state._replace(step=(), cache=())  # [batch, ...] each
    ids, scores = best_hypotheses(
        take_sentences(fields, leave)._replace(step=state.step), k, alpha
    )  # [batch - n, K, ...]
    at = tf.gather(sentences.rows, leave)[:, None]  # [batch - n, 1]
    results = (tf.tensor_scatter_nd_update(results[0], at, ids), tf.tensor_scatter_nd_update(results[1], at, scores))
    state = take_sentences(fields, keep)._replace(
        step=state.step, cache=compaction.select(state.cache, keep, state.step)
    )
    return state, take_sentences(sentences, keep), results


def beam_search(
    step_fn,
    initial_cache,
    batch_size,
    max_lengths,
    beam_size: int = 4,
    alpha: float = 0.6,
    reorder_cache=None,
    min_length=0,
    first_step_fn=None,
    forced_ids=None,
    early_stop: str = "finished",
    compaction: Compaction | None = None,
    constraint: Constraint | None = None,
    constraint_inputs=(),
    min_finished=1,
):
    """Finds the ``beam_size`` best continuations of BOS for each batch row.

    Args:
      step_fn: ``(ids [batch*beam], cache, step) → (log_probs [batch*beam, vocab], cache)``;
        ``step`` is the position of ``ids`` (0 for BOS).
      initial_cache: nested ``[batch*beam, ...]`` tensors (beams already tiled).
      batch_size: scalar.
      max_lengths: ``int32[batch]``: most tokens (EOS included) each row may produce.
      beam_size: K. One beam with α > 0 is not greedy search: a finished hypothesis can
        lose to a longer live one (greedy search: :mod:`tf_transformer.decoding.greedy`).
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
      forced_ids: optional ``int32[batch, prefix_len]``, 0-padded: a target
        prefix each row's hypotheses start with (:func:`force_prefix`); its
        tokens count in the scores as any other. ``max_lengths`` must leave
        room for it and one more token.
      early_stop: when a sentence's search ends before its maximum length
        (:data:`EARLY_STOPS`, :func:`sentence_done`).
      compaction: how to drop finished sentences from the cache (:class:`Compaction`);
        with it, once a quarter of the sentences a step computed are done, later
        steps compute the others only (dropping at every sentence that ends, or at an
        eighth, copied the cache more often for less: docs/design/decoding.md).
        Without it (and under XLA, which needs fixed shapes) every step computes
        every sentence until the last is done; the hypotheses are the same either way.
      constraint: optional :class:`Constraint`: the tokens each hypothesis may write;
        ``constraint_inputs`` (nested ``[batch, ...]``) is what it reads of each sentence.
      min_finished: with ``early_stop="best"``, the finished hypotheses a sentence needs
        before it ends (the n-best asked; a scalar, or a scalar tensor).

    Returns:
      ``(ids int32[batch, beam, length], scores float32[batch, beam], steps)``:
      hypotheses best first, without BOS, padded with 0 after EOS; scores are
      log-probabilities divided by the length penalty; ``steps`` is the number
      of decoding steps run (fewer than the maximum when every row stopped early).
    """
    batch, k = batch_size, beam_size
    if early_stop not in EARLY_STOPS:
        raise ValueError(f"early_stop must be one of {', '.join(EARLY_STOPS)}, got {early_stop!r}")
    if reorder_cache is None:

        def reorder_cache(cache, beams):
            return _gather_beams(cache, beams, tf.shape(beams)[0], k)

    if in_xla():
        compaction = None
    length = tf.reduce_max(max_lengths)
    sentences = Sentences(
        rows=tf.range(batch),
        max_lengths=max_lengths,
        best_possible_penalty=length_penalty(max_lengths, alpha),
        forced_ids=() if forced_ids is None else forced_ids,
        constraint_inputs=constraint_inputs if constraint is not None else (),
    )

    def advance(state: BeamState, sentences: Sentences, log_probs) -> BeamState:
        """The state after step ``state.step``, from its ``log_probs`` ``[batch, K, vocab]``."""
        if constraint is not None:  # first: a constraint that renormalizes reads the model's whole row
            log_probs = constraint.constrain(
                log_probs, state.constraint, sentences.constraint_inputs, state.step, sentences.max_lengths
            )  # [batch, K, vocab]
        if forced_ids is not None:
            log_probs = force_prefix(log_probs, sentences.forced_ids, state.step)
        candidates = expand(state, log_probs, min_length, sentences.max_lengths, length)
        state = keep_finished(keep_live(state, candidates, k, reorder_cache, constraint), candidates, k, alpha)
        state = state._replace(step=state.step + 1)
        done = sentence_done(state, early_stop, sentences.max_lengths, sentences.best_possible_penalty, min_finished)
        return state._replace(done=done)

    def decode_step(state: BeamState, sentences: Sentences) -> BeamState:
        """One decoding step of every sentence still searched."""
        rows = tf.shape(state.live_log_probs)[0]  # the sentences still searched
        ids = _flatten(state.live_ids[:, :, state.step])  # [rows*K]
        log_probs, cache = step_fn(ids, state.cache, state.step)  # [rows*K, vocab]
        return advance(state._replace(cache=cache), sentences, _unflatten(log_probs, rows, k))  # [rows, K, vocab]

    def worth_dropping(state: BeamState):
        """``bool[]``: a quarter of the sentences a step computed are done, not all (see ``compaction``)."""
        rows = tf.shape(state.done)[0]
        finished = tf.reduce_sum(tf.cast(state.done, tf.int32))
        return (finished > 0) & (finished < rows) & (4 * finished >= rows)

    state = initial_state(
        batch, k, length, initial_cache, () if constraint is None else constraint.start(batch, k, length + 1)
    )
    iterations = length
    if first_step_fn is not None:
        # Step 0 once per sentence; its row stands for every beam (only the first is alive).
        first_log_probs, cache = first_step_fn(state.live_ids[:, 0, 0], initial_cache)  # [batch, vocab]
        log_probs = tf.tile(first_log_probs[:, None, :], [1, k, 1])  # [batch, K, vocab]
        state = advance(state._replace(cache=cache), sentences, log_probs)
        iterations = tf.maximum(length - 1, 0)
    if compaction is None:
        state, sentences = tf.while_loop(
            lambda state, sentences: still_searching(state, length),
            lambda state, sentences: (decode_step(state, sentences), sentences),
            (state, sentences),
            maximum_iterations=iterations,
        )
        return (*best_hypotheses(state, k, alpha), state.step)

    # Steps run in an inner loop until a quarter of its sentences are done; the outer loop then
    # drops them (compact) and starts the next. A tf.cond in every step instead cost a Switch and
    # a Merge per tensor of the state, the cache and the results at every step
    # (docs/design/decoding.md).
    state_shapes = unknown_sentences(state._replace(step=(), cache=()))._replace(
        step=state.step.shape, cache=compaction.shapes(state.cache)
    )

    def steps(state: BeamState, sentences: Sentences) -> BeamState:
        """Steps until the search ends or a quarter of its sentences are done."""

        def run():
            return tf.while_loop(
                lambda state, sentences: still_searching(state, length) & ~worth_dropping(state),
                lambda state, sentences: (decode_step(state, sentences), sentences),
                (state, sentences),
                shape_invariants=(state_shapes, unknown_sentences(sentences)),
            )[0]

        if compaction.by_rows is None:
            return run()
        return compaction.by_rows(tf.shape(state.done)[0] * k, run)  # rows: sentences × K

    def phase(state: BeamState, sentences: Sentences, results):
        state = steps(state, sentences)
        return tf.cond(
            worth_dropping(state),
            lambda: compact(state, sentences, results, compaction, alpha),
            lambda: (state, sentences, results),
        )

    results = (tf.zeros([batch, k, length], tf.int32), tf.zeros([batch, k], tf.float32))  # [batch, K, ...]
    state, sentences, results = tf.while_loop(
        lambda state, sentences, results: still_searching(state, length),
        phase,
        (state, sentences, results),
        shape_invariants=(
            state_shapes,
            unknown_sentences(sentences),
            tf.nest.map_structure(lambda x: x.shape, results),
        ),
    )
    ids, scores = best_hypotheses(state, k, alpha)
    at = sentences.rows[:, None]  # the sentences still in the loop join those dropped before
    ids, scores = tf.tensor_scatter_nd_update(results[0], at, ids), tf.tensor_scatter_nd_update(results[1], at, scores)
    return ids, scores, state.step

"""Decoding only well-formed trees over the input words: which symbols may come next, at every step.

Section 6.3 decodes trees as sequences, and a free search may write any sequence:
brackets that do not match, a word skipped or misspelt. A parser's output should
be a tree over exactly its input words by construction, and the decoder knows at
each step what can come next (:mod:`~tf_transformer.tasks.parsing.linearization`):

- an opening ``(X``, while words remain and the budget leaves room to close it,
  and at most :data:`MAX_OPENINGS` in a row (without a word or closing between);
- the closing of the innermost open constituent (its labelled closing, or the
  bare ``)``), only once it holds a word (the root's only once every word is
  placed, so there is one root);
- under ``words``, the next input word's next piece (a word's later pieces are
  forced: no bracket inside a word); under ``xx`` and ``tags``, any preterminal
  symbol while words remain;
- EOS once every word is placed and every bracket closed (at once for a source without words).

Words go inside a constituent; an opening is allowed only while the output can
still place the remaining words, close every bracket and end within the search's
maximum length. So every hypothesis can always end, and every finished one is a
tree over the input.

The scores stay the model's log-probabilities of the tokens chosen: nothing is
renormalized, and a word's first piece is not given the mass of every word piece
(the model's misspelt copies), which both scored lower on the tune split for a
model trained over every token (docs/design/parsing.md#the-tree-constraint). So where
the model's own output is a tree over the input, the constrained search finds
the same. A model trained over the allowed tokens only (``--tree_loss allowed``)
is scored as it trained: ``renormalize`` takes each step's softmax over them.

The state of each hypothesis is explicit (:class:`TreeState`) and moves with its
beam like the decoder's cache; each sentence's source pieces are read from the
search's input ids. Stock TensorFlow ops only (a few ``[rows, vocab]`` selects a
step), so an export with the constraint runs in TF Serving.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2

from tf_transformer.constants import EOS_ID, PAD_ID
from tf_transformer.decoding.beam_search import NEG_INF, Constraint
from tf_transformer.tasks.parsing.linearization import BARE_CLOSING, SCHEMES, symbol_kind

_USER_DEFINED = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
# The most constituents opened in a row, before a word or closing. Without a cap, a model that gives the input's
# next word a low probability opens bracket after bracket, as far as the length budget allows. The treebank
# sample opens up to 6 in a row (5 or more in 28 of its 48,000 runs, 4 in 367); 3 parsed the tune split best of
# 2, 3, 4 and 6 (docs/design/parsing.md#the-tree-constraint).
MAX_OPENINGS = 3
NO_TOKEN = -1  # an id no token has: "none allowed" in the comparisons below


class TreeState(NamedTuple):
    """Where one hypothesis stands in its tree, ``[batch, K, ...]`` each (``K`` 1 for greedy search).

    Fields:
      placed: ``int32[batch, K]``, the input units written so far (pieces under ``words``, else words).
      depth: ``int32[batch, K]``, the constituents open.
      filled: ``bool[batch, K]``, whether the innermost open constituent holds a word yet.
      opened: ``int32[batch, K]``, the constituents opened since the last word or closing.
      closings: ``int32[batch, K, length]``, the id of each open constituent's closing symbol,
        outermost first (entries at ``depth`` and past: stale).
    """

    placed: tf.Tensor
    depth: tf.Tensor
    filled: tf.Tensor
    opened: tf.Tensor
    closings: tf.Tensor


class TreeInput(NamedTuple):
    """What the constraint reads of each sentence's input, ``[batch, ...]`` each.

    Fields:
      pieces: ``int32[batch, src_len]``, the source's pieces without EOS, 0-padded.
      units: ``int32[batch]``, what the tree must place: pieces under ``words``, else words.
    """

    pieces: tf.Tensor
    units: tf.Tensor


class TreeConstraint(Constraint):
    """The symbols that keep each hypothesis a well-formed tree over its input (see the module).

    Args:
      model_proto: the run's SentencePiece model (its user-defined pieces are the tree symbols).
      scheme: the linearization (``words``, ``xx`` or ``tags``).
      vocab_size: the model's output ids (tokens past the proto's pieces are never allowed).
      max_openings: the most constituents opened in a row (``None``: no cap).
      renormalize: :meth:`constrain` renormalizes over the allowed tokens (see the module).
    """

    def __init__(
        self,
        model_proto: bytes,
        scheme: str,
        vocab_size: int,
        max_openings: int | None = MAX_OPENINGS,
        renormalize: bool = False,
    ):
        if scheme not in SCHEMES:
            raise ValueError(f"tree must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        self.scheme = scheme
        self.max_openings = max_openings
        self.renormalize = renormalize
        model = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
        pieces = [(piece.piece, piece.type) for piece in model.pieces][:vocab_size]
        symbols = {piece: index for index, (piece, kind) in enumerate(pieces) if kind == _USER_DEFINED}
        self.opens = np.zeros([vocab_size], bool)  # [vocab]: an opening whose closing the vocabulary holds
        self.closing_of = np.full([vocab_size], NO_TOKEN, np.int32)  # [vocab]: an opening's closing id
        self.closes = np.zeros([vocab_size], bool)  # [vocab]
        self.leaves = np.zeros([vocab_size], bool)  # [vocab]: a preterminal symbol (xx, tags)
        self.starts_word = np.zeros([vocab_size], bool)  # [vocab]: a word's first piece
        for index, (piece, kind) in enumerate(pieces):
            if kind != _USER_DEFINED:
                self.starts_word[index] = piece.startswith("▁")
                continue
            role, label = symbol_kind(piece)
            closing = f"){label}" if f"){label}" in symbols else BARE_CLOSING  # labelled, or bare (--closings bare)
            if role == "open" and closing in symbols:
                self.opens[index] = True
                self.closing_of[index] = symbols[closing]
            self.closes[index] = role == "close"
            self.leaves[index] = role == "leaf" and scheme != "words"
        if not self.opens.any():
            raise ValueError("The vocabulary holds no bracket symbols: it is not a parser's")

    def read_input(self, source_ids) -> TreeInput:
        """The :class:`TreeInput` of source ids ``int32[batch, src_len]`` (EOS-terminated, 0-padded)."""
        pieces = tf.where(source_ids == EOS_ID, PAD_ID, source_ids)  # [batch, src_len]
        if self.scheme == "words":
            units = tf.reduce_sum(tf.cast(pieces != PAD_ID, tf.int32), axis=1)  # [batch]
        else:  # a word per piece that starts one (the first piece always does)
            first = tf.range(tf.shape(pieces)[1]) == 0  # [src_len]
            starts = tf.gather(tf.constant(self.starts_word), pieces) | first[None, :]
            units = tf.reduce_sum(tf.cast(starts & (pieces != PAD_ID), tf.int32), axis=1)  # [batch]
        return TreeInput(pieces, units)

    def start(self, batch, beams: int, length) -> TreeState:
        """Every hypothesis before its first token: nothing placed, nothing open."""
        zeros = tf.zeros([batch, beams], tf.int32)
        empty = tf.zeros([batch, beams], tf.bool)
        return TreeState(zeros, zeros, empty, zeros, tf.zeros([batch, beams, length], tf.int32))

    def constrain(self, log_probs, state: TreeState, sentences: TreeInput, step, max_lengths):
        """``log_probs`` ``[batch, K, vocab]`` of the tokens each hypothesis may write at ``step``
        (:meth:`allowed`; renormalized over them with ``renormalize``), the others ``NEG_INF``."""
        allowed = self.allowed(state, sentences, step, max_lengths)
        if not self.renormalize:
            return tf.where(allowed, log_probs, NEG_INF)
        return tf.where(allowed, tf.nn.log_softmax(tf.where(allowed, log_probs, NEG_INF)), NEG_INF)

    def allowed(self, state: TreeState, sentences: TreeInput, step, max_lengths):
        """``bool[batch, K, vocab]``: the tokens each hypothesis may write at ``step`` (the module's rules).

        ``max_lengths`` ``int32[batch]``: each sentence's most tokens, EOS counted. An
        opening needs room for the remaining units, a closing per open bracket, its
        own closing and EOS after it.
        """
        innermost = tf.gather(state.closings, tf.maximum(state.depth - 1, 0), batch_dims=2)  # [batch, K]
        return self._allowed(state, innermost, sentences, step, max_lengths)

    def allowed_along(self, targets, max_lengths=None):
        """``bool[batch, T, vocab]``: what the search would allow at each position of ``targets`` ``int32[batch, T]``
        (within ``max_lengths`` ``int32[batch]``, each sentence's most tokens as the search's; ``None``: no bound).

        Teacher forcing feeds the decoder the target's first ``t`` tokens, so
        position ``t``'s state is the one the search reaches after writing them;
        the input words are the target's own (under ``words`` its word pieces, the
        source's pieces for a well-formed target). The states of all positions
        are computed at once: counts by cumulative sums, the innermost open
        constituent as the last opening before ``t`` one level above ``t``'s
        depth (``[batch, T, T]`` comparisons). Tokens after EOS read as if the
        target ended there.
        """
        targets = tf.cast(targets, tf.int32)
        opened = tf.gather(tf.constant(self.opens), targets)  # [batch, T]
        closed = tf.gather(tf.constant(self.closes), targets)
        ended = (targets == EOS_ID) | (targets == PAD_ID)
        if self.scheme == "words":
            units = ~opened & ~closed & ~ended  # [batch, T]: the target's word pieces
        else:
            units = tf.gather(tf.constant(self.leaves), targets)
        steps = tf.cast(opened, tf.int32) - tf.cast(closed, tf.int32)  # [batch, T]
        depth = tf.cumsum(steps, axis=1, exclusive=True)  # [batch, T]: open before position t
        length = tf.shape(targets)[1]
        positions = tf.range(length)  # [T]
        before = positions[None, :, None] > positions[None, None, :]  # [1, T (t), T (s)]: s < t
        # The innermost constituent open at t was opened at the last s < t that opened level depth[t] − 1.
        opener = before & opened[:, None, :] & (depth[:, None, :] == depth[:, :, None] - 1)  # [batch, T, T]
        last_opener = tf.reduce_max(tf.where(opener, positions, -1), axis=2)  # [batch, T]
        opener_id = tf.gather(targets, tf.maximum(last_opener, 0), batch_dims=1)  # [batch, T]
        innermost = tf.where(last_opener >= 0, tf.gather(tf.constant(self.closing_of), opener_id), NO_TOKEN)
        # Openings in a row before t: back to the last s < t that was not an opening.
        other = before & ~opened[:, None, :]  # [batch, T, T]
        last_other = tf.reduce_max(tf.where(other, positions, -1), axis=2)  # [batch, T]
        placed = tf.cumsum(tf.cast(units, tf.int32), axis=1, exclusive=True)  # [batch, T]
        # The input: the target's units in order, padded to T (static shapes, for XLA too).
        slot = units[:, None, :] & (placed[:, None, :] == positions[None, :, None])  # [batch, T (unit), T (s)]
        pieces = tf.reduce_sum(tf.where(slot, targets[:, None, :], 0), axis=2)  # [batch, T]
        state = TreeState(
            placed=placed,
            depth=depth,
            filled=tf.pad(~opened[:, :-1], [[0, 0], [1, 0]]),  # a word or a closed child before t fills it
            opened=positions[None, :] - 1 - last_other,
            closings=None,  # read as ``innermost`` only
        )
        sentences = TreeInput(pieces, tf.reduce_sum(tf.cast(units, tf.int32), axis=1))
        if max_lengths is None:
            max_lengths = tf.fill([tf.shape(targets)[0]], tf.int32.max // 2)  # [batch]: no length budget
        return self._allowed(state, innermost, sentences, positions, max_lengths)

    def _allowed(self, state: TreeState, innermost, sentences: TreeInput, step, max_lengths):
        """:meth:`allowed` given each hypothesis's ``innermost`` closing id ``int32[batch, K]``."""
        vocab = len(self.opens)
        remaining = sentences.units[:, None] - state.placed  # [batch, K]
        length = tf.shape(sentences.pieces)[1]
        next_piece = tf.gather(sentences.pieces, tf.minimum(state.placed, tf.maximum(length - 1, 0)), batch_dims=1)
        if self.scheme == "words":
            between_words = (remaining <= 0) | tf.gather(tf.constant(self.starts_word), next_piece)  # [batch, K]
        else:
            between_words = tf.ones_like(remaining, tf.bool)
        room = max_lengths[:, None] - (step + 1)  # [batch, K]: tokens after this one
        may_open = (remaining > 0) & between_words & (remaining + state.depth + 2 <= room)
        if self.max_openings is not None:
            may_open &= state.opened < self.max_openings
        may_close = (state.depth > 0) & state.filled & between_words & ((state.depth > 1) | (remaining <= 0))
        may_place = (remaining > 0) & (state.depth > 0)
        may_end = (remaining <= 0) & (state.depth == 0) & ((state.placed > 0) | (sentences.units[:, None] == 0))
        singles = [tf.where(may_close, innermost, NO_TOKEN), tf.where(may_end, EOS_ID, NO_TOKEN)]
        if self.scheme == "words":
            singles.append(tf.where(may_place, next_piece, NO_TOKEN))
        singles = tf.stack(singles, axis=-1)  # [batch, K, 2 or 3]: the tokens allowed one by one
        tokens = tf.range(vocab)  # [vocab]
        allowed = tf.reduce_any(tokens == singles[..., None], axis=2)  # [batch, K, vocab]
        allowed |= tf.constant(self.opens)[None, None, :] & may_open[..., None]
        if self.leaves.any():
            allowed |= tf.constant(self.leaves)[None, None, :] & may_place[..., None]
        return allowed

    def advance(self, state: TreeState, tokens) -> TreeState:
        """The state after each hypothesis wrote ``tokens`` ``int32[batch, K]`` (EOS and padding: unchanged)."""
        opened = tf.gather(tf.constant(self.opens), tokens)  # [batch, K]
        closed = tf.gather(tf.constant(self.closes), tokens)
        ended = (tokens == EOS_ID) | (tokens == PAD_ID)
        if self.scheme == "words":
            placed = ~opened & ~closed & ~ended
        else:
            placed = tf.gather(tf.constant(self.leaves), tokens)
        level = tf.range(tf.shape(state.closings)[2]) == state.depth[..., None]  # [batch, K, length]
        closing = tf.gather(tf.constant(self.closing_of), tokens)  # [batch, K]
        return TreeState(
            placed=state.placed + tf.cast(placed, tf.int32),
            depth=state.depth + tf.cast(opened, tf.int32) - tf.cast(closed, tf.int32),
            filled=tf.where(ended, state.filled, ~opened),  # a word or a closed child fills the constituent
            opened=tf.where(ended, state.opened, tf.where(opened, state.opened + 1, 0)),
            closings=tf.where(level & opened[..., None], closing[..., None], state.closings),
        )


def tree_constraint(tokenizer, tree: str | None, vocab_size: int, renormalize: bool = False) -> TreeConstraint | None:
    """The constraint of a parser's ``tree`` linearization over ``tokenizer``'s vocabulary
    (a :class:`pipelines.Tokenizer`; ``vocab_size``: the model's outputs); ``None`` for ``None``."""
    if tree is None:
        return None
    return TreeConstraint(tokenizer.target_proto or tokenizer.model_proto, tree, vocab_size, renormalize=renormalize)

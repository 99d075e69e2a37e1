"""Word alignments from encoder–decoder attention, in the ``i-j`` (source-target) format.

The attention of one decoder layer, heads averaged, says which source pieces each
target piece attended to. Alignments are between words, so pieces are merged
first as :mod:`tf_transformer.attention_views.maps` states: a SentencePiece piece that
starts with "▁" starts a word; on the attended (source) side a word's weight is
the sum of its pieces' (the attention a word receives), on the attending (target)
side the mean of its pieces' rows (each piece of the word votes equally). Each target word is then aligned to the source
word it attends to most (argmax), as fairseq's ``--print-alignment`` does with
its attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tf_transformer.attention_views.maps import WORD_START, merge_pieces, word_index
from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID

__all__ = [
    "format_alignment",
    "graph_word_alignment",
    "hypothesis_attention",
    "merge_pieces",
    "word_alignment",
    "word_index",
]


def hypothesis_attention(model, source_ids, target_ids, layer: int):
    """Encoder–decoder attention of decoder layer ``layer``, heads averaged, over a given translation.

    A teacher-forced pass of ``target_ids`` (``int32[batch, tgt_len]``, the
    hypothesis with its EOS, 0-padded) after the search, which the search itself
    leaves untouched. ``layer`` counts from 0; negative counts from the top.
    Returns ``float32[batch, tgt_len, src_len]``: row ``t`` is what target token
    ``t`` attended to while it was predicted; padded keys have weight 0.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    target_ids = tf.convert_to_tensor(target_ids, tf.int32)
    bos = tf.fill([tf.shape(target_ids)[0], 1], BOS_ID)
    decoder_input = tf.concat([bos, target_ids[:, :-1]], axis=1)  # [batch, tgt_len]: BOS + target[:-1]
    _, weights = model.attention_weights({"inputs": source_ids, "targets": decoder_input})
    cross = weights["decoder"][layer]["cross_attention"]  # [batch, heads, tgt_len, src_len]
    return tf.reduce_mean(tf.cast(cross, tf.float32), axis=1)


def graph_word_alignment(attention, source_ids, target_ids, source_pieces, target_pieces):
    """:func:`word_alignment` in the graph, for a batch: ``string[batch]`` of ``"i-j …"``.

    Args:
      attention: ``float32[batch, tgt_len, src_len]`` (:func:`hypothesis_attention`).
      source_ids, target_ids: ``int32[batch, src_len]`` / ``[batch, tgt_len]``; EOS and
        padding take no part.
      source_pieces, target_pieces: the ids' pieces (``string``, same shapes).
    """

    def words(ids, pieces):  # [batch, len] word index of each piece (-1: EOS or padding), word count
        real = (ids != PAD_ID) & (ids != EOS_ID)
        first = tf.equal(tf.cumsum(tf.cast(real, tf.int32), axis=1), 1) & real  # a sentence's first piece
        starts = real & (first | tf.strings.regex_full_match(pieces, WORD_START + ".*"))
        index = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
        return tf.where(real, index, -1), tf.reduce_max(index, axis=1) + 1

    source_words, _ = words(source_ids, source_pieces)  # [batch, src_len]
    target_words, target_count = words(target_ids, target_pieces)  # [batch, tgt_len]
    width = tf.maximum(tf.shape(source_ids)[1], tf.shape(target_ids)[1])  # at least as many as words
    to_source = tf.one_hot(source_words, width)  # [batch, src_len, words]: zero for EOS and padding
    to_target = tf.one_hot(target_words, width)  # [batch, tgt_len, words]
    summed = tf.einsum("bts,bsw->btw", tf.cast(attention, tf.float32), to_source)  # attended side: sum
    merged = tf.einsum("btv,btw->bvw", to_target, summed)  # [batch, target words, source words]
    merged /= tf.maximum(tf.reduce_sum(to_target, axis=1), 1.0)[:, :, None]  # attending side: mean
    best = tf.argmax(merged, axis=2, output_type=tf.int32)  # [batch, target words]
    target_index = tf.broadcast_to(tf.range(width)[None, :], tf.shape(best))  # [batch, target words]
    pairs = tf.strings.join([tf.strings.as_string(best), tf.strings.as_string(target_index)], "-")
    keep = tf.range(width)[None, :] < target_count[:, None]  # [batch, words]
    return tf.strings.reduce_join(tf.ragged.boolean_mask(pairs, keep), axis=1, separator=" ")


def word_alignment(
    attention: np.ndarray, source_pieces: Sequence[str], target_pieces: Sequence[str]
) -> list[tuple[int, int]]:
    """``(source word, target word)`` pairs: each target word with the source word it attends to most."""
    words = merge_pieces(attention, source_pieces, target_pieces)
    if not words.size:
        return []
    return [(int(np.argmax(row)), target) for target, row in enumerate(words)]


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """``"0-0 1-2 2-1"``: the Pharaoh ``i-j`` format fast_align, Moses and fairseq write."""
    return " ".join(f"{source}-{target}" for source, target in pairs)

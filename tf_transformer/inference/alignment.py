"""Word alignments from encoder–decoder attention, in the ``i-j`` (source-target) format.

The attention of one decoder layer, heads averaged, says which source pieces each
target piece attended to. Alignments are between words, so pieces are merged
first: a SentencePiece piece that starts with "▁" starts a word. On the attended
(source) side a word's weight is the sum of its pieces' (the attention a word
receives), on the attending (target) side the mean of its pieces' rows (each
piece of the word votes equally). Each target word is then aligned to the source
word it attends to most (argmax), as fairseq's ``--print-alignment`` does with
its attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tf_transformer.constants import BOS_ID

WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a word


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


def word_index(pieces: Sequence[str]) -> np.ndarray:
    """The word each piece belongs to: ``int[pieces]``, counting from 0.

    A piece that starts with "▁" starts a new word; the first piece starts one whatever it holds.
    """
    starts = np.array([i == 0 or piece.startswith(WORD_START) for i, piece in enumerate(pieces)], bool)
    return np.cumsum(starts) - 1


def merge_pieces(attention: np.ndarray, source_pieces: Sequence[str], target_pieces: Sequence[str]) -> np.ndarray:
    """``[target pieces, source pieces]`` attention → ``[target words, source words]``.

    Summed over a source word's pieces, averaged over a target word's pieces
    (see the module). Rows that summed to 1 over the pieces still do over the words.
    """
    attention = np.asarray(attention, np.float64)
    if attention.shape != (len(target_pieces), len(source_pieces)):
        raise ValueError(
            f"attention of shape {attention.shape} does not match {len(target_pieces)} target and "
            f"{len(source_pieces)} source pieces"
        )
    source_words, target_words = word_index(source_pieces), word_index(target_pieces)
    summed = np.zeros([len(target_pieces), source_words[-1] + 1 if len(source_pieces) else 0])
    np.add.at(summed.T, source_words, attention.T)  # [target pieces, source words]
    merged = np.zeros([target_words[-1] + 1 if len(target_pieces) else 0, summed.shape[1]])
    np.add.at(merged, target_words, summed)
    counts = np.bincount(target_words, minlength=merged.shape[0])[:, None]  # pieces per target word
    return merged / np.maximum(counts, 1)


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

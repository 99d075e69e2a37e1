"""Every attention weight of one translation, labelled by its tokens (the paper's figures 3–5).

Section 3.2 computes, per layer and head, a distribution over keys for every
query (eq. 1); figures 3–5 of the paper draw those distributions for the
encoder's self-attention. :func:`attention_maps` runs the model once, teacher-forced
on a translation (the search is left untouched), and keeps every layer's weights
of the three kinds of attention (section 3.2.3) with the tokens on each axis.

Pieces can be merged into words (:meth:`AttentionMaps.words`): a SentencePiece
piece that starts with "▁" starts a word. On the attended (key) side a word's
weight is the sum of its pieces' weights, the attention the word receives; on
the attending (query) side a word's row is the mean of its pieces' rows, each
piece voting equally. Rows that summed to 1 over pieces still do over words.
``<s>`` and ``</s>`` are words of their own; ``<unk>`` is a piece like any
other (it starts a word only as a sentence's first piece), as in the exported
graph's rule (:func:`~tf_transformer.attention_views.alignment.graph_word_alignment`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import numpy as np

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID

WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a word
SPECIAL = ("<s>", "</s>", "<pad>", "<unk>")  # SentencePiece's names of the special pieces
BOUNDARIES = ("<s>", "</s>")  # the pieces that are words of their own


def penultimate(num_layers: int) -> int:
    """The layer (from 0) the paper-style figures show by default: figures 3–5 show layer 5 of 6."""
    return max(num_layers - 2, 0)


def hypothesis_length(ids: np.ndarray) -> int:
    """Tokens of a search's output up to and with its first EOS (every real token where none was written)."""
    ends = np.flatnonzero(ids == EOS_ID)
    return int(ends[0]) + 1 if len(ends) else int(np.count_nonzero(ids != PAD_ID))


def word_index(pieces: Sequence[str]) -> np.ndarray:
    """The word each piece belongs to: ``int[pieces]``, counting from 0.

    A piece that starts with "▁" starts a new word; the first piece starts one
    whatever it holds; ``<s>`` and ``</s>`` are words of their own, so the piece
    after them starts another.
    """
    starts = [
        i == 0 or piece.startswith(WORD_START) or piece in BOUNDARIES or pieces[i - 1] in BOUNDARIES
        for i, piece in enumerate(pieces)
    ]
    return np.cumsum(np.array(starts, bool)) - 1


def words_of(pieces: Sequence[str]) -> list[str]:
    """The words the pieces make, "▁" removed: ``["▁Ein", "▁Hund", "e"] → ["Ein", "Hunde"]``."""
    index = word_index(pieces)
    words = [""] * (int(index[-1]) + 1 if len(pieces) else 0)
    for word, piece in zip(index, pieces, strict=True):
        words[word] += piece
    return [word.replace(WORD_START, " ").strip() or word for word in words]


def merge_pieces(attention: np.ndarray, key_pieces: Sequence[str], query_pieces: Sequence[str]) -> np.ndarray:
    """``[..., query pieces, key pieces]`` attention → ``[..., query words, key words]``.

    Summed over a key word's pieces, averaged over a query word's pieces (see the
    module); leading axes (layers, heads) are kept.
    """
    attention = np.asarray(attention, np.float64)
    if attention.shape[-2:] != (len(query_pieces), len(key_pieces)):
        raise ValueError(
            f"attention of shape {attention.shape} does not match {len(query_pieces)} query and "
            f"{len(key_pieces)} key pieces"
        )
    key_words, query_words = word_index(key_pieces), word_index(query_pieces)
    keys = np.eye(key_words[-1] + 1 if len(key_pieces) else 0)[key_words]  # [key pieces, key words] one-hot
    queries = np.eye(query_words[-1] + 1 if len(query_pieces) else 0)[query_words]  # [query pieces, query words]
    queries /= np.maximum(queries.sum(axis=0, keepdims=True), 1)  # each piece of a word weighs 1 / its pieces
    return np.einsum("qw,...qk,kv->...wv", queries, attention, keys)


@dataclasses.dataclass(frozen=True)
class AttentionMaps:
    """The attention weights of one sentence pair, every layer and head, float32.

    Attributes:
      source: the source tokens, ``</s>`` last: the encoder's queries and keys, the
        encoder–decoder attention's keys.
      target: the target tokens, ``</s>`` last: the decoder's queries, each row the
        attention while that token was predicted.
      decoder_input: the decoder's input tokens (``<s>`` then the target without its
        last token): the decoder self-attention's keys.
      encoder: ``[layers, heads, source, source]`` encoder self-attention.
      decoder: ``[layers, heads, target, decoder_input]`` decoder self-attention (masked:
        nothing to the right of a token's own input position).
      cross: ``[layers, heads, target, source]`` encoder–decoder attention.
      unit: ``"pieces"`` or ``"words"`` (:meth:`words`).
    """

    source: list[str]
    target: list[str]
    decoder_input: list[str]
    encoder: np.ndarray
    decoder: np.ndarray
    cross: np.ndarray
    unit: str = "pieces"

    def words(self) -> AttentionMaps:
        """The same maps over words: keys summed over a word's pieces, queries averaged (the module)."""
        if self.unit == "words":
            return self
        return AttentionMaps(
            source=words_of(self.source),
            target=words_of(self.target),
            decoder_input=words_of(self.decoder_input),
            encoder=merge_pieces(self.encoder, self.source, self.source).astype(np.float32),
            decoder=merge_pieces(self.decoder, self.decoder_input, self.target).astype(np.float32),
            cross=merge_pieces(self.cross, self.source, self.target).astype(np.float32),
            unit="words",
        )

    def kind(self, name: str) -> tuple[np.ndarray, list[str], list[str]]:
        """``(weights [layers, heads, queries, keys], query tokens, key tokens)`` of one kind of attention.

        ``name``: ``"encoder"`` (self-attention), ``"decoder"`` (self-attention) or
        ``"cross"`` (encoder–decoder).
        """
        if name == "encoder":
            return self.encoder, self.source, self.source
        if name == "decoder":
            return self.decoder, self.target, self.decoder_input
        if name == "cross":
            return self.cross, self.target, self.source
        raise ValueError(f"no attention kind {name!r}: encoder, decoder or cross")


KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "encoder-decoder attention",
}


def attention_maps(
    model, source_ids: Sequence[int], target_ids: Sequence[int], piece: callable, bos_piece: str = "<s>"
) -> AttentionMaps:
    """Runs ``model`` teacher-forced on one translation and keeps every attention weight.

    Args:
      model: a :class:`~tf_transformer.model.Transformer`.
      source_ids: the source's ids, EOS last, no padding.
      target_ids: the translation's ids, EOS last, no padding (e.g. the best
        hypothesis of a search).
      piece: id → its SentencePiece piece (``SentencePieceProcessor.id_to_piece``).
    """
    source_ids = [int(i) for i in source_ids]
    target_ids = [int(i) for i in target_ids]
    decoder_input = [BOS_ID, *target_ids[:-1]]  # [tgt_len]: shifted right, as in training
    inputs = {"inputs": np.array([source_ids]), "targets": np.array([decoder_input])}
    with warnings.catch_warnings():
        # A one-token translation (EOS alone) gives the decoder one key, and Keras warns about a softmax over
        # one element; a weight of 1 on it is what attention over one key is.
        warnings.filterwarnings("ignore", message="You are using a softmax over axis", category=UserWarning)
        _, weights = model.attention_weights(inputs)

    def stack(kind, which):  # [layers, heads, queries, keys] of the one sentence
        return np.stack([np.asarray(layer[which], np.float32)[0] for layer in weights[kind]])

    return AttentionMaps(
        source=[piece(i) for i in source_ids],
        target=[piece(i) for i in target_ids],
        decoder_input=[bos_piece, *(piece(i) for i in target_ids[:-1])],
        encoder=stack("encoder", "self_attention"),
        decoder=stack("decoder", "self_attention"),
        cross=stack("decoder", "cross_attention"),
    )

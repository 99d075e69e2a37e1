"""A shared source-target SentencePiece vocabulary (section 5.1) and its in-graph tokenizer.

The paper used a shared BPE vocabulary of about 37,000 tokens for WMT EN–DE. We
train one SentencePiece model (BPE by default, unigram as an option) on the
training text of both sides, sampling sentences for big corpora, and tokenize
in the graph with ``tensorflow_text.SentencepieceTokenizer`` so the exported
model takes strings. Special ids are fixed: padding 0, UNK 1, BOS 2, EOS 3.
"""

from __future__ import annotations

import functools
import io
import os
import random
import tempfile
from collections.abc import Iterable, Sequence

import sentencepiece as spm
import tensorflow as tf
from absl import logging

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401  (re-exported)
from tf_transformer.language_codes import LANGUAGE_CODE, SourcePieces, has_language_codes


def _sample_sentences(pairs: Iterable[tuple[str, str]], max_sentences: int, seed: int) -> list[str]:
    """Both sides of up to ``max_sentences // 2`` pairs, reservoir-sampled when there are more."""
    keep = max(1, max_sentences // 2)
    reservoir: list[tuple[str, str]] = []
    rng = random.Random(seed)
    for index, pair in enumerate(pairs):
        if index < keep:
            reservoir.append(pair)
        else:
            slot = rng.randint(0, index)
            if slot < keep:
                reservoir[slot] = pair
    return [side for pair in reservoir for side in pair if side.strip()]


def train_sentencepiece(
    pairs: Iterable[tuple[str, str]],
    model_path: str,
    vocab_size: int = 8000,
    model_type: str = "bpe",
    max_sentences: int = 2_000_000,
    character_coverage: float = 1.0,
    byte_fallback: bool = False,
    seed: int = 0,
    max_sentence_length: int = 4192,
    user_defined_symbols: Sequence[str] = (),
) -> str:
    """Trains a shared SentencePiece model on both sides of ``pairs`` and writes ``model_path``.

    Args:
      pairs: ``(source, target)`` sentences (only the training split!).
      model_path: where the ``.model`` file goes; written atomically.
      vocab_size: requested size; smaller corpora may yield fewer pieces
        (``hard_vocab_limit=False``), so read the real size from the model.
      model_type: ``"bpe"`` (the paper's) or ``"unigram"``.
      max_sentences: sample at most this many sentences (both sides counted).
      character_coverage: 1.0 keeps every character of the sample.
      byte_fallback: spell unknown characters as UTF-8 bytes instead of UNK.
      seed: for sampling sentences.
      max_sentence_length: longer sentences (in UTF-8 bytes) are left out of
        vocabulary training, and counted in a warning: SentencePiece would skip
        them without a word. They stay in the corpus for training.
      user_defined_symbols: pieces the model holds whole, each one id (a
        parser's target symbols); they count toward ``vocab_size``.

    Returns:
      ``model_path``.
    """
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}")
    sentences = _sample_sentences(pairs, max_sentences, seed)
    kept = [sentence for sentence in sentences if len(sentence.encode("utf-8")) <= max_sentence_length]
    if len(kept) < len(sentences):
        logging.warning(
            "Vocabulary training leaves out %d of %d sampled sentences longer than %d UTF-8 bytes",
            len(sentences) - len(kept),
            len(sentences),
            max_sentence_length,
        )
    sentences = kept
    if not sentences:
        raise ValueError("Cannot train a vocabulary on an empty corpus")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        hard_vocab_limit=False,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        input_sentence_size=0,  # already sampled above
        max_sentence_length=max_sentence_length,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
        **({"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}),
    )
    directory = os.path.dirname(os.path.abspath(model_path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".tmp") as handle:
        handle.write(model.getvalue())
    os.replace(handle.name, model_path)
    return model_path


def target_model_beside(model_path: str) -> str:
    """Where the target side's model of ``model_path`` lives when it has one: ``sp.model`` → ``sp.target.model``."""
    root, extension = os.path.splitext(model_path)
    return f"{root}.target{extension}"


def vocabulary_size(proto: bytes) -> int:
    """The ids a model's ``proto`` gives the network: its pieces, or fewer when its ``trainer_spec.vocab_size``
    says so (an imported vocabulary keeps pieces it lacks past that size, tokenized as UNK)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    return min(len(model.pieces), model.trainer_spec.vocab_size or len(model.pieces))


class Tokenizer(tf.Module):
    """In-graph SentencePiece tokenization with the fixed special ids.

    ``tokenize`` maps ``string[batch]`` to ``int32`` ragged ids (no BOS/EOS);
    ``detokenize`` maps ids (ragged or padded with 0) back to strings, dropping
    padding, BOS and EOS. Ids equal the ``sentencepiece`` library's.

    One model serves both sides (section 5.1), unless a target model sits beside
    it (:func:`target_model_beside`, or ``target_model_path``): an imported Marian
    model segments each language with its own model over one id map
    (docs/importing.md). Targets are then tokenized and detokenized with the
    target model. A model may hold pieces past its :func:`vocabulary_size`: they
    tokenize as UNK, as Marian's vocabulary does with pieces it lacks.

    A source model holding language-code pieces such as ``>>deu<<`` (a
    multilingual OPUS-MT model's) takes the code at the start of a source as
    that one piece and segments the rest, as Marian's tokenizer in Hugging
    Face does (an unknown code is UNK); other models read ``>>`` as text.

    With a ``symbol_pattern`` (a parser's targets), a target is tokens
    separated by spaces: a token the pattern matches whole is a symbol, one
    piece of the model (an unknown one is UNK); any other token is a word, as
    SentencePiece pieces. ``detokenize_target`` writes symbols and words back
    separated by single spaces. Without one, both sides are text and the
    ``_target`` methods are ``tokenize`` and ``detokenize``.
    """

    def __init__(
        self,
        model_path: str,
        name: str = "tokenizer",
        symbol_pattern: str | None = None,
        target_model_path: str | None = None,
    ):
        super().__init__(name=name)
        self.symbol_pattern = symbol_pattern
        self.model_proto = self._read(model_path)
        self.model_path = model_path
        if target_model_path is None and tf.io.gfile.exists(target_model_beside(model_path)):
            target_model_path = target_model_beside(model_path)
        self.target_model_path = target_model_path
        self.target_proto = self._read(target_model_path) if target_model_path else None
        self._sp, self._target_sp = self._make_ops()
        self.vocab_size = vocabulary_size(self.model_proto)
        self._pieces = spm.SentencePieceProcessor(model_proto=self.model_proto).get_piece_size()
        self.language_codes = has_language_codes(self.model_proto)
        for path, proto in ((model_path, self.model_proto), (target_model_path, self.target_proto)):
            if proto is None:
                continue
            processor = spm.SentencePieceProcessor(model_proto=proto)
            special = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
            if special != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
                raise ValueError(
                    f"{path}: special ids (pad, unk, bos, eos) are {special}, "
                    f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; train it with pipelines.vocab.train_sentencepiece"
                )
            if vocabulary_size(proto) != self.vocab_size:
                raise ValueError(
                    f"{path}: {vocabulary_size(proto)} ids, but {model_path} has {self.vocab_size}: "
                    "a source and a target model must share one id map"
                )

    @staticmethod
    def _read(path: str) -> bytes:
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read()

    def _make_ops(self):
        """The SentencePiece ops of the source (or shared) model and of the target's (the same op without one).

        Named apart: a SavedModel loaded by TensorFlow 2 shares one model between two such ops of the same
        name, and would segment targets with the source's model."""
        import tensorflow_text as text

        source = text.SentencepieceTokenizer(model=self.model_proto, out_type=tf.int32, name="source_sentencepiece")
        if not self.target_proto:
            return source, source
        return source, text.SentencepieceTokenizer(
            model=self.target_proto, out_type=tf.int32, name="target_sentencepiece"
        )

    def _eager_retry(self, method, value, target=False):
        attribute = "_target_sp" if target and self.target_proto else "_sp"
        try:
            return getattr(getattr(self, attribute), method)(value)
        except tf.errors.NotFoundError:
            # tf.random.set_seed (and keras.utils.set_random_seed) clear TensorFlow's
            # eager kernel cache, which drops the op's loaded model: load it again.
            if not tf.executing_eagerly():
                raise
            self._sp, self._target_sp = self._make_ops()
            return getattr(getattr(self, attribute), method)(value)

    @property
    def separate_target(self) -> bool:
        """Whether the target side has its own model (see the class)."""
        return self.target_proto is not None

    def python_processor(self, target: bool = False) -> spm.SentencePieceProcessor:
        """The ``sentencepiece`` library's processor of the source model (of the target's with ``target``)."""
        proto = self.target_proto if target and self.target_proto else self.model_proto
        return spm.SentencePieceProcessor(model_proto=proto)

    @functools.cached_property
    def _source_pieces(self) -> SourcePieces:
        return SourcePieces(self.model_proto)

    def encode(self, text: str) -> list[int]:
        """One source ``text`` tokenized in Python, as :meth:`tokenize` does in the graph (no EOS)."""
        return [i if i < self.vocab_size else UNK_ID for i in self._source_pieces.encode(text)]

    def _known(self, ids):
        """``ids`` with those past :attr:`vocab_size` (pieces the id map lacks) replaced by UNK."""
        if self._pieces <= self.vocab_size:
            return ids
        return tf.ragged.map_flat_values(lambda flat: tf.where(flat < self.vocab_size, flat, UNK_ID), ids)

    def tokenize(self, strings):
        """``string[batch]`` → ``int32`` RaggedTensor ``[batch, (len)]``."""
        if not self.language_codes:
            return self._known(self._eager_retry("tokenize", strings))
        coded = tf.strings.regex_full_match(strings, f"(?s){LANGUAGE_CODE}.*")  # [batch]
        code = tf.strings.regex_replace(strings, f"(?s)^({LANGUAGE_CODE}).*$", r"\1", replace_global=False)
        rest = tf.strings.regex_replace(strings, f"(?s)^{LANGUAGE_CODE}", "", replace_global=False)
        rest = tf.where(coded, rest, strings)  # [batch]; not cut where the full match failed (invalid UTF-8)
        code_ids = tf.boolean_mask(self._eager_retry("string_to_id", code), coded)  # [coded]
        prefix = tf.RaggedTensor.from_row_lengths(code_ids, tf.cast(coded, tf.int64))  # [batch, (0 or 1)]
        return self._known(tf.concat([prefix, self._eager_retry("tokenize", rest)], axis=1))

    def pieces(self, ids):
        """``int`` ids of any shape → their SentencePiece pieces (``"▁"`` starts a word), same shape."""
        return self._eager_retry("id_to_string", ids, target=True)

    def detokenize(self, ids):
        """``int[batch, len]`` (ragged, or dense padded with 0) → ``string[batch]``."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids, padding=PAD_ID)
        keep = (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID)  # UNK stays: it detokenizes to " ⁇ "
        ids = tf.ragged.boolean_mask(ids, keep)
        return self._eager_retry("detokenize", ids, target=True)

    @property
    def target_symbols(self) -> bool:
        """Whether targets hold whole symbols (see the class)."""
        return self.symbol_pattern is not None

    def tokenize_target(self, strings):
        """Targets ``string[batch]`` → ``int32`` RaggedTensor ``[batch, (len)]`` (see the class)."""
        if not self.target_symbols:
            return self._known(self._eager_retry("tokenize", strings, target=True))
        tokens = tf.strings.split(strings)  # [batch, (tokens)]: runs of whitespace separate
        flat = tokens.flat_values  # [tokens]
        symbol = tf.strings.regex_full_match(flat, self.symbol_pattern)  # [tokens]
        words = self._eager_retry("tokenize", flat, target=True)  # [tokens, (pieces)]: a symbol as text too
        words = self._known(words)  # the symbols' pieces are dropped below
        words = tf.ragged.boolean_mask(words, words.with_flat_values(tf.repeat(~symbol, words.row_lengths())))
        ids = self._eager_retry("string_to_id", flat, target=True)[:, None]  # [tokens, 1]
        symbols = tf.ragged.boolean_mask(tf.RaggedTensor.from_tensor(ids), symbol[:, None])  # [tokens, (0 or 1)]
        per_token = tf.concat([symbols, words], axis=1)  # [tokens, (pieces)]: a symbol's id, or a word's pieces
        return tokens.with_flat_values(per_token).merge_dims(1, 2)  # [batch, (pieces)]

    def detokenize_target(self, ids):
        """Target ids ``int[batch, len]`` (ragged, or padded with 0) → ``string[batch]`` (see the class)."""
        if not self.target_symbols:
            return self.detokenize(ids)
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids, padding=PAD_ID)
        ids = tf.ragged.boolean_mask(ids, (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID))
        pieces = self.pieces(ids)  # [batch, (len)]
        symbol = tf.strings.regex_full_match(pieces.flat_values, self.symbol_pattern)
        text = tf.where(symbol, " " + pieces.flat_values + " ", tf.strings.regex_replace(pieces.flat_values, "▁", " "))
        joined = tf.strings.reduce_join(pieces.with_flat_values(text), axis=-1)  # [batch]
        return tf.strings.strip(tf.strings.regex_replace(joined, " +", " "))

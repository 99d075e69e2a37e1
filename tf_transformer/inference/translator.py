"""Strings in, translations out: tokenization, cached beam search and detokenization in one graph.

:class:`Translator` is what gets exported for TF Serving: its functions use only
stock TensorFlow and tensorflow-text ops.
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.vocab import Tokenizer
from tf_transformer.constants import EOS_ID, PAD_ID
from tf_transformer.inference.alignment import graph_word_alignment, hypothesis_attention
from tf_transformer.inference.beam_search import beam_search
from tf_transformer.inference.incremental import IncrementalDecoder


class Translator(tf.Module):
    """Beam-search translation with a trained :class:`~tf_transformer.model.Transformer` (section 6.1).

    Args:
      model: the trained model.
      tokenizer: the shared SentencePiece tokenizer of the run.
      beam_size: K (4 in the paper); for greedy search see :mod:`tf_transformer.inference.greedy`.
      alpha: GNMT length penalty exponent (0.6 in the paper).
      extra_length: maximum output length = input length + this (50 in the paper).
      min_length: no EOS before this many output tokens (EOS counted; 0: none).
      max_length: an absolute cap on the output length besides input + extra_length
        (EOS counted; raised to ``min_length`` where smaller). ``min_length ==
        max_length`` fixes the length, which makes speed comparisons do equal work.
      freeze_weights: lay the decoder's kernels out for decoding once, now, and keep
        them as variables (``frozen_weights``, saved with an export), instead of
        per search. A frozen translator does not follow later changes of the
        model's weights; :func:`~tf_transformer.inference.export.export_translator`
        exports a frozen copy (:meth:`frozen`).
      max_source_length: the longest source a search accepts, in tokens with EOS
        (``None``: any). Self-attention's memory grows with the square of the
        source length and the decoder's cache with source + ``extra_length``, so
        a server needs this bound: one very long sentence must not exhaust it.
        A longer source fails the call with ``InvalidArgumentError`` naming the
        limit, unless ``truncate_source``: then it is cut to its first
        ``max_source_length - 1`` tokens and EOS.
      streams: split every batch into this many equal parts, each searched by its
        own loop in the same graph; TensorFlow's executor runs the loops side by
        side on its inter-op threads (CTranslate2's ``inter_threads``). Meant for
        CPUs run with ``intra_op_parallelism_threads=1`` and
        ``inter_op_parallelism_threads=streams``: a decoding step is hundreds of
        small ops, and each then runs whole on one core instead of being split
        across the cores op by op (docs/design/decoding.md). Translations are
        one search's, up to float rounding (the products see fewer rows).
    """

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        beam_size: int = 4,
        alpha: float = 0.6,
        extra_length: int = 50,
        min_length: int = 0,
        max_length: int | None = None,
        freeze_weights: bool = False,
        streams: int = 1,
        max_source_length: int | None = None,
        truncate_source: bool = False,
    ):
        super().__init__(name="translator")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be positive, got {max_length}")
        if streams < 1:
            raise ValueError(f"streams must be positive, got {streams}")
        if max_source_length is not None and max_source_length < 2:
            raise ValueError(f"max_source_length must be at least 2 (a token and EOS), got {max_source_length}")
        if truncate_source and max_source_length is None:
            raise ValueError("truncate_source needs a max_source_length")
        self.model = model
        self.tokenizer = tokenizer
        self.beam_size = beam_size
        self.alpha = alpha
        self.extra_length = extra_length
        self.min_length = min_length
        self.max_length = max_length
        self.streams = streams
        self.max_source_length = max_source_length
        self.truncate_source = truncate_source
        self.decoding = IncrementalDecoder(model)
        self.frozen_weights = None
        if freeze_weights:
            self.frozen_weights = tf.Module(name="frozen_decoding_weights")
            self.frozen_weights.layers = tf.nest.map_structure(
                lambda kernel: tf.Variable(kernel, trainable=False), self.decoding.decoding_weights()
            )

    def frozen(self) -> Translator:
        """A copy of this translator with ``freeze_weights=True`` (the model's weights as they are now)."""
        return Translator(
            self.model,
            self.tokenizer,
            beam_size=self.beam_size,
            alpha=self.alpha,
            extra_length=self.extra_length,
            min_length=self.min_length,
            max_length=self.max_length,
            freeze_weights=True,
            streams=self.streams,
            max_source_length=self.max_source_length,
            truncate_source=self.truncate_source,
        )

    def search(
        self,
        inputs,
        beam_size: int | None = None,
        alpha: float | None = None,
        use_cache: bool = True,
        force_length: int | None = None,
        streams: int | None = None,
    ):
        """Token ids ``int32[batch, src_len]`` (EOS-terminated, 0-padded) → n-best.

        ``use_cache=False`` re-runs the whole decoder over the prefix at every
        step (for measuring what the cache saves); ``force_length`` sets both
        the minimum and the maximum output length (EOS included) for this call,
        so speed runs do a fixed amount of work; ``streams`` overrides the
        translator's (see the class).

        Returns ``(ids int32[batch, beam, out_len], scores float32[batch, beam], steps)``.
        """
        streams = self.streams if streams is None else streams
        if streams < 1:
            raise ValueError(f"streams must be positive, got {streams}")
        if streams == 1:
            return self._search(inputs, beam_size, alpha, use_cache, force_length)
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]
        # Equal parts: the last sentence is repeated to fill them. A copy ends when its
        # original does, so it never keeps its stream's loop running longer.
        filler = tf.repeat(inputs[-1:], (-batch) % streams, axis=0)  # [padding, src_len]
        parts = tf.split(tf.concat([inputs, filler], axis=0), streams)  # streams × [part, src_len]
        results = [self._search(part, beam_size, alpha, use_cache, force_length) for part in parts]
        length = tf.reduce_max(tf.stack([tf.shape(ids)[2] for ids, _, _ in results]))
        ids = tf.concat(
            [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]]) for ids, _, _ in results], axis=0
        )[:batch]  # [batch, beam, length]: padded with 0, as after EOS
        scores = tf.concat([scores for _, scores, _ in results], axis=0)[:batch]  # [batch, beam]
        steps = tf.reduce_max(tf.stack([steps for _, _, steps in results]))
        return ids, scores, steps

    def _search(self, inputs, beam_size, alpha, use_cache, force_length):
        """:meth:`search` of one batch in one loop."""
        beam_size = beam_size or self.beam_size
        alpha = self.alpha if alpha is None else alpha
        model = self.model
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]
        source_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
        min_length, cap = (force_length, force_length) if force_length else (self.min_length, self.max_length)
        max_lengths = source_lengths + self.extra_length  # [batch]: input length + 50
        if cap is not None:
            max_lengths = tf.minimum(max_lengths, cap)
        if min_length:
            max_lengths = tf.maximum(max_lengths, min_length)
        max_length = tf.reduce_max(max_lengths)
        decoding = self.decoding
        memory, memory_mask = decoding.encode(inputs)  # [batch, src_len, d_model]

        if use_cache:
            # Encoder-decoder keys and values once per sentence, shared by its beams;
            # the decoder's kernels laid out for one-row-per-hypothesis products.
            weights = None if self.frozen_weights is None else self.frozen_weights.layers
            constants = decoding.constants(memory, weights, memory_mask)
            cache = decoding.empty_cache(batch, max_length, memory.dtype, beam_size=beam_size)
            reorder_cache = decoding.reorder_cache

            def step_fn(ids, cache, step):
                logits, cache = decoding.step(ids, cache, constants, memory_mask, step)
                return tf.nn.log_softmax(logits, axis=-1), cache  # [batch * beam, vocab]

            def first_step_fn(ids, cache):  # step 0 once per sentence, not once per beam
                logits, cache = decoding.first_step(ids, cache, constants, memory_mask)
                return tf.nn.log_softmax(logits, axis=-1), cache  # [batch, vocab]
        else:
            # Every beam of a sentence runs the full decoder: tile to [batch * beam, ...].
            memory = tf.repeat(memory, beam_size, axis=0)
            memory_mask = tf.repeat(memory_mask, beam_size, axis=0)
            cache = {"prefix": tf.zeros([batch * beam_size, max_length], tf.int32)}  # [batch*beam, max_len]
            reorder_cache = first_step_fn = None

            def step_fn(ids, cache, step):
                position = tf.one_hot(step, max_length, dtype=tf.int32)[None, :]  # [1, max_len]
                prefix = cache["prefix"] * (1 - position) + ids[:, None] * position
                logits = model.decode(prefix, memory, memory_mask, training=False)  # [batch*beam, max_len, vocab]
                return tf.nn.log_softmax(logits[:, step], axis=-1), {"prefix": prefix}

        return beam_search(
            step_fn,
            cache,
            batch,
            max_lengths,
            beam_size=beam_size,
            alpha=alpha,
            reorder_cache=reorder_cache,
            min_length=min_length or 0,
            first_step_fn=first_step_fn,
        )

    def limit_source(self, inputs):
        """``int32[batch, src_len]`` held to ``max_source_length``: refused, or cut when ``truncate_source``."""
        if self.max_source_length is None:
            return inputs
        limit = self.max_source_length
        lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
        if not self.truncate_source:
            check = tf.debugging.assert_less_equal(
                lengths,
                limit,
                message=f"A source sentence is longer than this model's maximum source length of {limit} tokens "
                "(EOS included); shorten or split it",
            )
            with tf.control_dependencies([check]):
                return tf.identity(inputs)
        clipped = inputs[:, :limit]  # [batch, min(src_len, limit)]
        last = tf.range(tf.shape(clipped)[1]) == limit - 1  # [width]: the column EOS moves to
        return tf.where((lengths > limit)[:, None] & last[None, :], EOS_ID, clipped)

    def check_ids(self, inputs):
        """``int32[batch, src_len]`` from a client: every id inside the vocabulary, or a clear error."""
        vocab_size = self.model.src_vocab_size or self.model.vocab_size
        checks = [
            tf.debugging.assert_non_negative(inputs, message="Token ids must not be negative"),
            tf.debugging.assert_less(
                inputs, vocab_size, message=f"Token ids must be below the vocabulary size {vocab_size}"
            ),
        ]
        with tf.control_dependencies(checks):
            return tf.identity(inputs)

    def translate_ids(self, inputs):
        """``int32[batch, src_len]`` → ``{"ids": int32[batch, out_len], "scores": float32[batch]}`` (best only).

        Ids outside the vocabulary and sources over ``max_source_length`` fail the
        call with ``InvalidArgumentError`` naming the problem (an embedding lookup
        would fail too, but its message names no input).
        """
        ids, scores, _ = self.search(self.limit_source(self.check_ids(tf.convert_to_tensor(inputs, tf.int32))))
        return {"ids": ids[:, 0], "scores": scores[:, 0]}

    def encode_strings(self, texts):
        """``string[batch]`` → ``int32[batch, len]`` ids ending in EOS, 0-padded."""
        tokens = self.tokenizer.tokenize(tf.strings.strip(texts))  # [batch, (len)]
        eos = tf.fill([tokens.nrows(), 1], tf.constant(EOS_ID, tf.int32))
        return tf.concat([tokens, eos], axis=1).to_tensor(default_value=PAD_ID)

    def translate(self, texts, nbest: int = 1):
        """``string[batch]`` → ``{"translations": string[batch], "scores": float32[batch]}``.

        Empty (or all-whitespace) inputs give empty outputs with score 0. With
        ``nbest > 1`` the outputs are ``[batch, nbest]``.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        empty = tf.equal(tf.strings.length(tf.strings.strip(texts)), 0)  # [batch]
        ids, scores, _ = self.search(self.limit_source(self.encode_strings(texts)))
        batch = tf.shape(ids)[0]
        flat = tf.reshape(ids[:, :nbest], [batch * nbest, -1])  # [batch * nbest, len]
        strings = tf.reshape(self.tokenizer.detokenize(flat), [batch, nbest])
        strings = tf.where(empty[:, None], "", strings)
        scores = tf.where(empty[:, None], 0.0, scores[:, :nbest])
        if nbest == 1:
            return {"translations": strings[:, 0], "scores": scores[:, 0]}
        return {"translations": strings, "scores": scores}

    def translate_with_alignment(self, texts, layer: int):
        """:meth:`translate` (best only) with the best translation's alignment to its source.

        ``layer``: the decoder layer whose encoder–decoder attention (heads
        averaged) aligns, counting from 0 (negative: from the top). Returns, besides
        ``translations`` and ``scores``, ``alignments: string[batch]`` of
        source-target word pairs ``"i-j …"`` (:mod:`~tf_transformer.inference.alignment`),
        ``attention: float32[batch, out_len, src_len]`` over the pieces with EOS, and
        ``ids: int32[batch, out_len]``, the translation's pieces that label the
        attention's rows (0-padded; all 0 for an empty input). The attention comes
        from a teacher-forced pass over the translation after the search, which the
        search itself does not change.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        empty = tf.equal(tf.strings.length(tf.strings.strip(texts)), 0)  # [batch]
        source_ids = self.limit_source(self.encode_strings(texts))  # [batch, src_len]
        ids, scores, _ = self.search(source_ids)
        best = ids[:, 0]  # [batch, out_len]
        attention = hypothesis_attention(self.model, source_ids, best, layer)  # [batch, out_len, src_len]
        pieces = self.tokenizer.pieces
        alignments = graph_word_alignment(attention, source_ids, best, pieces(source_ids), pieces(best))
        return {
            "translations": tf.where(empty, "", self.tokenizer.detokenize(best)),
            "scores": tf.where(empty, 0.0, scores[:, 0]),
            "alignments": tf.where(empty, "", alignments),
            "attention": attention,
            "ids": tf.where(empty[:, None], PAD_ID, best),
        }

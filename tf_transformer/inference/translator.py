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
from tf_transformer.inference.decode_options import DecodeOptions
from tf_transformer.inference.incremental import IncrementalDecoder


class Translator(tf.Module):
    """Beam-search translation with a trained :class:`~tf_transformer.model.Transformer` (section 6.1).

    Args:
      model: the trained model.
      tokenizer: the shared SentencePiece tokenizer of the run.
      options: how to decode (:class:`~tf_transformer.inference.decode_options.DecodeOptions`:
        beam, α, length limits, batch parts, the longest source), fixed for the
        translator's life (default: the paper's); ``DecodeOptions.from_config`` fills
        in a run's defaults.
      freeze_weights: lay the decoder's kernels out for decoding once, now, and keep
        them as variables (``frozen_weights``, saved with an export), instead of
        per search. A frozen translator does not follow later changes of the
        model's weights; :func:`~tf_transformer.inference.export.export_translator`
        exports a frozen copy (:meth:`frozen`).
    """

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        options: DecodeOptions | None = None,
        freeze_weights: bool = False,
    ):
        super().__init__(name="translator")
        self.model = model
        self.tokenizer = tokenizer
        self.options = options or DecodeOptions()
        self.decoding = IncrementalDecoder(model)
        self.frozen_weights = None
        if freeze_weights:
            self.frozen_weights = tf.Module(name="frozen_decoding_weights")
            self.frozen_weights.layers = tf.nest.map_structure(
                lambda kernel: tf.Variable(kernel, trainable=False), self.decoding.decoding_weights()
            )

    def frozen(self) -> Translator:
        """A copy of this translator with ``freeze_weights=True`` (the model's weights as they are now)."""
        return Translator(self.model, self.tokenizer, self.options, freeze_weights=True)

    def search(
        self,
        inputs,
        beam_size: int | None = None,
        alpha: float | None = None,
        use_cache: bool = True,
        force_length: int | None = None,
        batch_parts: int | None = None,
    ):
        """Token ids ``int32[batch, src_len]`` (EOS-terminated, 0-padded) → n-best.

        ``use_cache=False`` re-runs the whole decoder over the prefix at every
        step (for measuring what the cache saves); ``force_length`` sets both
        the minimum and the maximum output length (EOS included) for this call,
        so speed runs do a fixed amount of work; ``beam_size``, ``alpha`` and
        ``batch_parts`` override the translator's options for this call.

        Returns ``(ids int32[batch, beam, out_len], scores float32[batch, beam], steps)``.
        """
        parts = self.options.batch_parts if batch_parts is None else batch_parts
        if parts < 1:
            raise ValueError(f"batch_parts must be positive, got {parts}")
        if parts == 1:
            return self._search(inputs, beam_size, alpha, use_cache, force_length)
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]
        # Equal parts: the last sentence is repeated to fill them. A copy ends when its
        # original does, so it never keeps its part's loop running longer.
        filler = tf.repeat(inputs[-1:], (-batch) % parts, axis=0)  # [padding, src_len]
        splits = tf.split(tf.concat([inputs, filler], axis=0), parts)  # parts × [batch / parts, src_len]
        results = [self._search(split, beam_size, alpha, use_cache, force_length) for split in splits]
        length = tf.reduce_max(tf.stack([tf.shape(ids)[2] for ids, _, _ in results]))
        ids = tf.concat(
            [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]]) for ids, _, _ in results], axis=0
        )[:batch]  # [batch, beam, length]: padded with 0, as after EOS
        scores = tf.concat([scores for _, scores, _ in results], axis=0)[:batch]  # [batch, beam]
        steps = tf.reduce_max(tf.stack([steps for _, _, steps in results]))
        return ids, scores, steps

    def _search(self, inputs, beam_size, alpha, use_cache, force_length):
        """:meth:`search` of one batch in one loop."""
        options = self.options
        beam_size = beam_size or options.beam_size
        alpha = options.alpha if alpha is None else alpha
        model = self.model
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]
        source_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
        min_length, cap = (
            (force_length, force_length) if force_length else (options.min_length, options.max_output_length)
        )
        # DecodeOptions.longest_output, per sentence of the batch.
        max_lengths = source_lengths + options.max_extra_length  # [batch]: input length + 50
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
        limit = self.options.max_source_length
        if limit is None:
            return inputs
        lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
        if not self.options.truncate_source:
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
        vocab_size = self.model.source_vocab_size or self.model.vocab_size
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
        strings = tf.reshape(self.tokenizer.detokenize_target(flat), [batch, nbest])
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
            "translations": tf.where(empty, "", self.tokenizer.detokenize_target(best)),
            "scores": tf.where(empty, 0.0, scores[:, 0]),
            "alignments": tf.where(empty, "", alignments),
            "attention": attention,
            "ids": tf.where(empty[:, None], PAD_ID, best),
        }

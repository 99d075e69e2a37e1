"""Strings in, translations out: tokenization, cached beam search and detokenization in one graph.

:class:`Translator` is what gets exported for TF Serving: its functions use only
stock TensorFlow and tensorflow-text ops.
"""

from __future__ import annotations

import tensorflow as tf

from pipelines.vocab import Tokenizer
from tf_transformer.constants import EOS_ID, PAD_ID
from tf_transformer.decoding.alignment import graph_word_alignment, hypothesis_attention
from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.incremental import IncrementalDecoder
from tf_transformer.decoding.sampling import sample_search
from tf_transformer.decoding.scoring import score_ids

# The beam sizes an options signature compiles in (:meth:`Translator.translate_with_options`), besides the
# export's own: the search builds its beam into its shapes, so a request picks one of a fixed set.
BEAM_SIZES = (1, 2, 4, 8)


class Translator(tf.Module):
    """Beam-search translation with a trained :class:`~tf_transformer.model.Transformer` (section 6.1).

    Args:
      model: the trained model.
      tokenizer: the shared SentencePiece tokenizer of the run.
      options: how to decode (:class:`~tf_transformer.decoding.decode_options.DecodeOptions`:
        beam, α, length limits, batch parts, the longest source), fixed for the
        translator's life (default: the paper's); ``DecodeOptions.from_config`` fills
        in a run's defaults.
      freeze_weights: lay the decoder's kernels out for decoding once, now, and keep
        them as variables (``frozen_weights``, saved with an export), instead of
        per search. A frozen translator does not follow later changes of the
        model's weights; :func:`~tf_transformer.exporting.saved_model.export_translator`
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
        min_length=None,
        max_extra_length=None,
        prefix_ids=None,
    ):
        """Token ids ``int32[batch, src_len]`` (EOS-terminated, 0-padded) → n-best.

        ``use_cache=False`` re-runs the whole decoder over the prefix at every
        step (for measuring what the cache saves); ``force_length`` sets both
        the minimum and the maximum output length (EOS included) for this call,
        so speed runs do a fixed amount of work; ``beam_size``, ``alpha``,
        ``batch_parts``, ``min_length`` and ``max_extra_length`` override the
        translator's options for this call (α, ``min_length`` and
        ``max_extra_length`` may be scalar tensors: one graph for any value).
        ``prefix_ids`` ``int32[batch, prefix_len]`` (0-padded, no EOS): each
        output starts with its row's prefix (:func:`~tf_transformer.decoding.beam_search.beam_search`'s
        ``forced_ids``), and may be one token longer than it whatever the other limits.

        Returns ``(ids int32[batch, beam, out_len], scores float32[batch, beam], steps)``.
        """
        parts = self.options.batch_parts if batch_parts is None else batch_parts
        if parts < 1:
            raise ValueError(f"batch_parts must be positive, got {parts}")
        limits = (beam_size, alpha, use_cache, force_length, min_length, max_extra_length)
        if parts == 1:
            return self._search(inputs, *limits, prefix_ids)
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]

        def split(rows):  # [batch, ...] → parts × [batch / parts, ...]
            # Equal parts: the last sentence is repeated to fill them. A copy ends when its
            # original does, so it never keeps its part's loop running longer.
            filler = tf.repeat(rows[-1:], (-batch) % parts, axis=0)  # [padding, ...]
            return tf.split(tf.concat([rows, filler], axis=0), parts)

        prefixes = [None] * parts if prefix_ids is None else split(tf.convert_to_tensor(prefix_ids, tf.int32))
        results = [self._search(rows, *limits, prefix) for rows, prefix in zip(split(inputs), prefixes, strict=True)]
        length = tf.reduce_max(tf.stack([tf.shape(ids)[2] for ids, _, _ in results]))
        ids = tf.concat(
            [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]]) for ids, _, _ in results], axis=0
        )[:batch]  # [batch, beam, length]: padded with 0, as after EOS
        scores = tf.concat([scores for _, scores, _ in results], axis=0)[:batch]  # [batch, beam]
        steps = tf.reduce_max(tf.stack([steps for _, _, steps in results]))
        return ids, scores, steps

    def _search(self, inputs, beam_size, alpha, use_cache, force_length, min_length, max_extra_length, prefix_ids):
        """:meth:`search` of one batch in one loop."""
        options = self.options
        beam_size = beam_size or options.beam_size
        alpha = options.alpha if alpha is None else alpha
        model = self.model
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]
        source_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
        min_length = options.min_length if min_length is None else min_length
        cap = options.max_output_length
        if force_length:
            min_length = cap = force_length
        extra = options.max_extra_length if max_extra_length is None else max_extra_length
        # DecodeOptions.longest_output, per sentence of the batch.
        max_lengths = source_lengths + extra  # [batch]: input length + 50
        if cap is not None:
            max_lengths = tf.minimum(max_lengths, cap)
        if prefix_ids is not None:  # room for the prefix and one token (EOS) after it
            prefix_ids = tf.convert_to_tensor(prefix_ids, tf.int32)
            prefix_lengths = tf.reduce_sum(tf.cast(prefix_ids != PAD_ID, tf.int32), axis=1)  # [batch]
            max_lengths = tf.maximum(max_lengths, prefix_lengths + 1)
        if not isinstance(min_length, int) or min_length:
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
            min_length=min_length,
            first_step_fn=first_step_fn,
            forced_ids=prefix_ids,
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

    def encode_targets(self, texts):
        """Targets ``string[batch]`` → ``int32[batch, len]`` ids ending in EOS, 0-padded (as training reads them)."""
        tokens = self.tokenizer.tokenize_target(tf.strings.strip(texts))  # [batch, (len)]
        eos = tf.fill([tokens.nrows(), 1], tf.constant(EOS_ID, tf.int32))
        return tf.concat([tokens, eos], axis=1).to_tensor(default_value=PAD_ID)

    def encode_prefixes(self, texts):
        """Target prefixes ``string[batch]`` → ``int32[batch, len]``, without EOS, 0-padded ("": none).

        A prefix is tokenized as a whole target text: one that ends inside a
        word is cut into that word's beginning as if the word were complete
        (SentencePiece has no notion of an unfinished word), and the search
        may continue it with pieces that do not start a word.
        """
        return self.tokenizer.tokenize_target(tf.strings.strip(texts)).to_tensor(default_value=PAD_ID)

    def longest_target(self, max_extra_length=None):
        """The most target tokens (EOS counted) a call may score or force: ``None`` without a source limit."""
        limit = self.options.max_source_length
        if limit is None:
            return None
        return limit + (self.options.max_extra_length if max_extra_length is None else max_extra_length)

    def _check_targets(self, target_ids, what: str, extra: int = 0):
        """``target_ids`` held to :meth:`longest_target` (``extra`` more tokens than it counts come after them)."""
        longest = self.longest_target()
        if longest is None:
            return target_ids
        lengths = tf.reduce_sum(tf.cast(target_ids != PAD_ID, tf.int32), axis=1) + extra  # [batch]
        check = tf.debugging.assert_less_equal(
            lengths,
            longest,
            message=f"A {what} is longer than this model's longest output of {longest} tokens (EOS included)",
        )
        with tf.control_dependencies([check]):
            return tf.identity(target_ids)

    def score(self, texts, targets, alpha=None):
        """The model's log-probability of each of ``targets`` given its source in ``texts`` (teacher-forced).

        ``string[batch]`` each → :func:`~tf_transformer.decoding.scoring.score_ids`'s
        ``log_probs`` and ``scores`` ``float32[batch]`` (with α, by default the
        translator's), ``token_log_probs`` ``float32[batch, len]`` and ``lengths``
        ``int32[batch]`` (EOS counted). A target is text as a translation of
        this model reads (a parser's: its linearization). The search's own best
        output scores what the search said it scored (up to float rounding).
        """
        source_ids = self.limit_source(self.encode_strings(tf.convert_to_tensor(texts, tf.string)))
        target_ids = self._check_targets(self.encode_targets(tf.convert_to_tensor(targets, tf.string)), "target")
        return score_ids(self.model, source_ids, target_ids, self.options.alpha if alpha is None else alpha)

    def _extra_length_checks(self, extra) -> list:
        """Assertions that a request's ``max_extra_length`` is within ``[0, options.max_extra_length]``."""
        most = self.options.max_extra_length
        return [
            tf.debugging.assert_non_negative(extra, message="Decoding option max_extra_length must not be negative"),
            tf.debugging.assert_less_equal(
                extra, most, message=f"Decoding option max_extra_length must be at most {most}, this model's most"
            ),
        ]

    def translate_with_options(
        self, texts, target_prefix=None, beam_size=None, alpha=None, nbest=1, min_length=None, max_extra_length=None
    ):
        """:meth:`translate` with decoding options given per call (scalar tensors: one graph serves any).

        ``beam_size`` must be the translator's own or one of :data:`BEAM_SIZES`
        (each compiled into the graph: a search builds its beam into its shapes);
        ``nbest`` at most the beam size; ``max_extra_length`` at most the
        translator's (its cache and memory bound); ``min_length`` at most the
        longest output. ``target_prefix`` ``string[batch]``: each output starts
        with its prefix ("": none; :meth:`encode_prefixes`), whose tokens count
        in its score. Options out of range fail the call with
        ``InvalidArgumentError`` naming the option.

        Returns ``translations`` ``string[batch, nbest]``, ``scores``
        ``float32[batch, nbest]`` and ``ids`` ``int32[batch, nbest, len]`` (0-padded).
        """
        options = self.options
        texts = tf.convert_to_tensor(texts, tf.string)
        beam_size = tf.convert_to_tensor(options.beam_size if beam_size is None else beam_size, tf.int32)
        alpha = tf.convert_to_tensor(options.alpha if alpha is None else alpha, tf.float32)
        nbest = tf.convert_to_tensor(nbest, tf.int32)
        min_length = tf.convert_to_tensor(options.min_length if min_length is None else min_length, tf.int32)
        extra = tf.convert_to_tensor(options.max_extra_length if max_extra_length is None else max_extra_length)
        extra = tf.cast(extra, tf.int32)
        sizes = sorted({*BEAM_SIZES, options.beam_size})
        longest = self.longest_target(0)  # the source limit: longest_target(extra) below
        checks = [
            tf.debugging.assert_equal(
                tf.reduce_any(tf.equal(beam_size, sizes)),
                True,
                message=f"Decoding option beam_size must be one of {', '.join(map(str, sizes))}",
            ),
            tf.debugging.assert_greater_equal(nbest, 1, message="Decoding option nbest must be at least 1"),
            tf.debugging.assert_less_equal(nbest, beam_size, message="Decoding option nbest must be at most beam_size"),
            *self._extra_length_checks(extra),
            tf.debugging.assert_non_negative(min_length, message="Decoding option min_length must not be negative"),
            tf.debugging.assert_non_negative(alpha, message="Decoding option alpha must not be negative"),
        ]
        if longest is not None:
            checks.append(
                tf.debugging.assert_less_equal(
                    min_length,
                    longest + options.max_extra_length,
                    message=f"Decoding option min_length must be at most {longest + options.max_extra_length}",
                )
            )
        with tf.control_dependencies(checks):
            source_ids = self.limit_source(self.encode_strings(texts))  # [batch, src_len]
        prefix_ids = None
        if target_prefix is not None:  # room for the prefix and EOS within the longest output
            prefix_ids = self._check_targets(self.encode_prefixes(tf.convert_to_tensor(target_prefix)), "prefix", 1)
        widest = max(sizes)

        def search_with(size):
            def run():
                ids, scores, _ = self.search(
                    source_ids,
                    beam_size=size,
                    alpha=alpha,
                    min_length=min_length,
                    max_extra_length=extra,
                    prefix_ids=prefix_ids,
                )  # [batch, size, len], [batch, size]
                pad = widest - size
                return tf.pad(ids, [[0, 0], [0, pad], [0, 0]]), tf.pad(scores, [[0, 0], [0, pad]])

            return run

        branch = tf.argmax(tf.cast(tf.equal(beam_size, sizes), tf.int32), output_type=tf.int32)
        ids, scores = tf.switch_case(branch, [search_with(size) for size in sizes])  # [batch, widest, len]
        ids, scores = ids[:, :nbest], scores[:, :nbest]  # [batch, nbest, len], [batch, nbest]
        batch, length = tf.shape(ids)[0], tf.shape(ids)[2]
        strings = tf.reshape(self.tokenizer.detokenize_target(tf.reshape(ids, [-1, length])), [batch, nbest])
        empty = tf.equal(tf.strings.length(tf.strings.strip(texts)), 0)[:, None]  # [batch, 1]
        return {
            "translations": tf.where(empty, "", strings),
            "scores": tf.where(empty, 0.0, scores),
            "ids": tf.where(empty[:, :, None], PAD_ID, ids),
        }

    def sample(self, texts, seed, temperature=1.0, top_k=0, top_p=1.0, max_extra_length=None):
        """Translations of ``texts`` sampled (:func:`~tf_transformer.decoding.sampling.sample_search`), one each.

        Returns ``translations`` ``string[batch]`` and ``scores`` ``float32[batch]``,
        each output's log-probability under the model (not length-normalized).
        ``temperature`` must be positive, ``top_k`` not negative, ``top_p`` in
        (0, 1], ``max_extra_length`` at most the translator's; otherwise the call
        fails with ``InvalidArgumentError`` naming the option.
        """
        options = self.options
        texts = tf.convert_to_tensor(texts, tf.string)
        extra = tf.cast(options.max_extra_length if max_extra_length is None else max_extra_length, tf.int32)
        temperature = tf.cast(temperature, tf.float32)
        top_k, top_p = tf.cast(top_k, tf.int32), tf.cast(top_p, tf.float32)
        checks = [
            tf.debugging.assert_positive(temperature, message="Sampling option temperature must be positive"),
            tf.debugging.assert_non_negative(top_k, message="Sampling option top_k must not be negative (0: all)"),
            tf.debugging.assert_positive(top_p, message="Sampling option top_p must be in (0, 1]"),
            tf.debugging.assert_less_equal(top_p, 1.0, message="Sampling option top_p must be in (0, 1]"),
            *self._extra_length_checks(extra),
        ]
        with tf.control_dependencies(checks):
            source_ids = self.limit_source(self.encode_strings(texts))  # [batch, src_len]
        ids, log_probs = sample_search(
            self.model,
            source_ids,
            seed,
            temperature,
            top_k,
            top_p,
            max_extra_length=extra,
            max_output_length=options.max_output_length,
            min_length=options.min_length,
            decoding=self.decoding,
            weights=None if self.frozen_weights is None else self.frozen_weights.layers,
        )
        empty = tf.equal(tf.strings.length(tf.strings.strip(texts)), 0)  # [batch]
        return {
            "translations": tf.where(empty, "", self.tokenizer.detokenize_target(ids)),
            "scores": tf.where(empty, 0.0, log_probs),
        }

    def translate_with_alignment(self, texts, layer: int):
        """:meth:`translate` (best only) with the best translation's alignment to its source.

        ``layer``: the decoder layer whose encoder–decoder attention (heads
        averaged) aligns, counting from 0 (negative: from the top). Returns, besides
        ``translations`` and ``scores``, ``alignments: string[batch]`` of
        source-target word pairs ``"i-j …"`` (:mod:`~tf_transformer.decoding.alignment`),
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

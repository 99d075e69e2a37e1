"""Strings in, translations out: tokenization, cached beam search and detokenization in one graph.

:class:`Translator` is what gets exported for TF Serving: its functions use only
stock TensorFlow and tensorflow-text ops.
"""

from __future__ import annotations

import tensorflow as tf

from configs.decoding import DRAW_SETTINGS, SETTINGS
from pipelines.vocab import Tokenizer
from tf_transformer.attention_views.alignment import graph_word_alignment, hypothesis_attention
from tf_transformer.constants import EOS_ID, PAD_ID
from tf_transformer.decoding import cache as caching
from tf_transformer.decoding import cached_attention
from tf_transformer.decoding.beam_search import Compaction, beam_search, take_sentences, unknown_sentences
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.incremental import MEMORY_SENTENCES, IncrementalDecoder
from tf_transformer.decoding.request import DecodeRequest, Sampling
from tf_transformer.decoding.sampling import sample_search
from tf_transformer.decoding.scoring import score_ids
from tf_transformer.decoding.tree_constraint import tree_constraint

# A search's cache entries besides the decoder's and the memory's keys and values: one row per sentence each.
_SENTENCE = ("memory_mask",)

_ASSERTIONS = {
    ">=": tf.debugging.assert_greater_equal,
    ">": tf.debugging.assert_greater,
    "<=": tf.debugging.assert_less_equal,
}


class Translator(tf.Module):
    """Beam-search translation with a trained :class:`~tf_transformer.model.Transformer` (section 6.1).

    Args:
      model: the trained model.
      tokenizer: the shared SentencePiece tokenizer of the run.
      options: how to decode (:class:`~tf_transformer.decoding.decode_options.DecodeOptions`:
        beam, α, length limits, batch parts, the longest source, a parser's tree
        constraint), fixed for the
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
        self.constraint = tree_constraint(  # a parser's, or None
            tokenizer, self.options.tree, model.config.vocab_size, self.options.renormalize
        )
        self.frozen_weights = None
        if freeze_weights:
            self.frozen_weights = tf.Module(name="frozen_decoding_weights")
            self.frozen_weights.layers = tf.nest.map_structure(
                lambda kernel: tf.Variable(kernel, trainable=False), self.decoding.decoding_weights()
            )

    def frozen(self) -> Translator:
        """A copy of this translator with ``freeze_weights=True`` (the model's weights as they are now)."""
        return Translator(self.model, self.tokenizer, self.options, freeze_weights=True)

    def with_options(self, **changes) -> Translator:
        """This translator with ``changes`` to its options (its frozen weights shared, if any).

        ``min_length`` = ``max_output_length`` = n makes every output n tokens
        long, so that speed runs do a fixed amount of work.
        """
        copy = Translator(self.model, self.tokenizer, self.options.replace(**changes))
        copy.frozen_weights = self.frozen_weights
        return copy

    def search(self, inputs, request: DecodeRequest | None = None, prefix_ids=None):
        """Token ids ``int32[batch, src_len]`` (EOS-terminated, 0-padded) → n-best.

        ``request`` (:class:`~tf_transformer.decoding.request.DecodeRequest`): what
        this call changes of the translator's options (beam size, α,
        ``min_length``, ``max_extra_length``; all but the beam size may be scalar
        tensors: one graph for any value). ``prefix_ids`` ``int32[batch, prefix_len]``
        (0-padded, no EOS): each output starts with its row's prefix
        (:func:`~tf_transformer.decoding.beam_search.beam_search`'s ``forced_ids``),
        and may be one token longer than it whatever the other limits.

        Returns ``(ids int32[batch, beam, out_len], scores float32[batch, beam], steps)``.
        """
        request = (request or DecodeRequest()).resolved(self.options)
        parts = self.options.batch_parts
        if parts == 1:
            return self._search(inputs, request, prefix_ids)
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]

        def split(rows):  # [batch, ...] → parts × [batch / parts, ...]
            # Equal parts: the last sentence is repeated to fill them. A copy ends when its
            # original does, so it never keeps its part's loop running longer.
            filler = tf.repeat(rows[-1:], (-batch) % parts, axis=0)  # [padding, ...]
            return tf.split(tf.concat([rows, filler], axis=0), parts)

        prefixes = [None] * parts if prefix_ids is None else split(tf.convert_to_tensor(prefix_ids, tf.int32))
        results = [self._search(rows, request, prefix) for rows, prefix in zip(split(inputs), prefixes, strict=True)]
        length = tf.reduce_max(tf.stack([tf.shape(ids)[2] for ids, _, _ in results]))
        ids = tf.concat(
            [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]]) for ids, _, _ in results], axis=0
        )[:batch]  # [batch, beam, length]: padded with 0, as after EOS
        scores = tf.concat([scores for _, scores, _ in results], axis=0)[:batch]  # [batch, beam]
        steps = tf.reduce_max(tf.stack([steps for _, _, steps in results]))
        return ids, scores, steps

    def _search(self, inputs, request: DecodeRequest, prefix_ids):
        """:meth:`search` of one batch in one loop, with a ``request`` resolved against the options."""
        beam_size = request.beam_size
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        batch = tf.shape(inputs)[0]
        source_lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1)  # [batch]
        prefix_lengths = None
        if prefix_ids is not None:
            prefix_ids = tf.convert_to_tensor(prefix_ids, tf.int32)
            prefix_lengths = tf.reduce_sum(tf.cast(prefix_ids != PAD_ID, tf.int32), axis=1)  # [batch]
        max_lengths = self.options.longest_output(
            source_lengths, request, prefix_lengths, tf.minimum, tf.maximum
        )  # [batch]: input length + 50, within the caps
        max_length = tf.reduce_max(max_lengths)
        decoding = self.decoding
        memory, memory_mask = decoding.encode(inputs)  # [batch, src_len, d_model]

        # Encoder-decoder keys and values once per sentence, shared by its beams; the decoder's
        # kernels laid out for one-row-per-hypothesis products. What is per sentence (the memory's
        # keys and values, its mask, the decoder's cache) is the search's cache, which drops
        # the sentences whose hypotheses are final.
        weights = None if self.frozen_weights is None else self.frozen_weights.layers
        constants = decoding.constants(memory, weights, memory_mask)
        cache = {
            "decoder": decoding.empty_cache(batch, max_length, memory.dtype, beam_size=beam_size),
            "memory": constants["memory"],  # keys and values, [layers, batch, ...]
            "memory_mask": memory_mask,  # [batch, 1, 1, src_len]
        }

        def constants_of(cache):
            return {**constants, "memory": cache["memory"]}

        def step_fn(ids, cache, step):
            logits, decoder = decoding.step(ids, cache["decoder"], constants_of(cache), cache["memory_mask"], step)
            return tf.nn.log_softmax(logits, axis=-1), {**cache, "decoder": decoder}  # [batch * beam, vocab]

        def first_step_fn(ids, cache):  # step 0 once per sentence, not once per beam
            logits, decoder = decoding.first_step(ids, cache["decoder"], constants_of(cache), cache["memory_mask"])
            return tf.nn.log_softmax(logits, axis=-1), {**cache, "decoder": decoder}  # [batch, vocab]

        def reorder_cache(cache, beams):
            return {**cache, "decoder": decoding.reorder_cache(cache["decoder"], beams)}

        def select(cache, keep, step):
            selected = take_sentences({key: cache[key] for key in _SENTENCE}, keep)
            return {
                **selected,
                "memory": take_sentences(cache["memory"], keep, axis=MEMORY_SENTENCES),
                "decoder": caching.select_sentences(cache["decoder"], keep, step),
            }

        def shapes(cache):
            relaxed = unknown_sentences({key: cache[key] for key in _SENTENCE})
            return {
                **relaxed,
                "memory": unknown_sentences(cache["memory"], axis=MEMORY_SENTENCES),
                "decoder": caching.sentence_shapes(cache["decoder"]),
            }

        return beam_search(
            step_fn,
            cache,
            batch,
            max_lengths,
            beam_size=beam_size,
            alpha=request.alpha,
            reorder_cache=reorder_cache,
            min_length=request.min_length,
            first_step_fn=first_step_fn,
            forced_ids=prefix_ids,
            early_stop=self.options.early_stop,
            compaction=Compaction(select, shapes, by_rows=cached_attention.products_by_rows),
            constraint=self.constraint,
            constraint_inputs=() if self.constraint is None else self.constraint.read_input(inputs),
            min_finished=request.nbest,
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
        vocab_size = self.model.config.encoder_vocab_size
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

    def encode_strings(self, texts, split: bool = True):
        """``string[batch]`` → ``int32[batch, len]`` ids ending in EOS, 0-padded (split into words first
        as the options' ``word_tokenizer`` says, unless not ``split``)."""
        texts = tf.strings.strip(texts)
        if split and self.options.word_tokenizer == "penn":
            from tf_transformer.tasks.parsing.penn import penn_tokenize

            texts = penn_tokenize(texts)
        tokens = self.tokenizer.tokenize(texts)  # [batch, (len)]
        eos = tf.fill([tokens.nrows(), 1], tf.constant(EOS_ID, tf.int32))
        return tf.concat([tokens, eos], axis=1).to_tensor(default_value=PAD_ID)

    def translate(self, texts, request: DecodeRequest | None = None, target_prefix=None):
        """``string[batch]`` → ``{"translations": string[batch], "scores": float32[batch]}``.

        ``request``: what this call changes of the options, in Python values
        built into the graph (checked against the options, any beam size
        allowed; for scalar tensors see :meth:`translate_with_options`). With
        ``nbest > 1`` the outputs are ``[batch, nbest]``. ``target_prefix``
        ``string[batch]``: each output starts with its prefix ("": none;
        :meth:`encode_prefixes`), whose tokens count in its score. Empty (or
        all-whitespace) inputs give empty outputs with score 0.
        """
        request = request or DecodeRequest()
        if not request.is_default():  # the translator's own options are what they are
            request = request.check(self.options, compiled_beams=False)
        texts = tf.convert_to_tensor(texts, tf.string)
        source_ids, prefix_ids = self._encode(texts, target_prefix)
        ids, scores, _ = self.search(source_ids, request, prefix_ids)
        outputs = self._nbest(texts, ids, scores, request.nbest)
        if request.nbest == 1:
            return {"translations": outputs["translations"][:, 0], "scores": outputs["scores"][:, 0]}
        return {"translations": outputs["translations"], "scores": outputs["scores"]}

    def _encode(self, texts, target_prefix=None, checks=()):
        """``(source_ids, prefix_ids)`` of ``string[batch]`` sources, computed after ``checks``, and of their
        target prefixes (``None`` without): ``int32[batch, src_len]`` and ``int32[batch, prefix_len]``."""
        with tf.control_dependencies(list(checks)):
            source_ids = self.limit_source(self.encode_strings(texts))  # [batch, src_len]
        if target_prefix is None:
            return source_ids, None
        # Room for the prefix and EOS within the longest output.
        prefix_ids = self._check_targets(self.encode_prefixes(tf.convert_to_tensor(target_prefix)), "prefix", 1)
        return source_ids, prefix_ids

    def _nbest(self, texts, ids, scores, nbest):
        """``translations`` ``string[batch, nbest]``, ``scores`` and ``ids`` of the first ``nbest`` hypotheses."""
        ids, scores = ids[:, :nbest], scores[:, :nbest]  # [batch, nbest, len], [batch, nbest]
        batch, length = tf.shape(ids)[0], tf.shape(ids)[2]
        strings = tf.reshape(self.tokenizer.detokenize_target(tf.reshape(ids, [-1, length])), [batch, nbest])
        return blank_empty_inputs(texts, {"translations": strings, "scores": scores, "ids": ids})

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
        # The sources are the words of the targets, split already (a parser's gold trees).
        source_ids = self.limit_source(self.encode_strings(tf.convert_to_tensor(texts, tf.string), split=False))
        target_ids = self._check_targets(self.encode_targets(tf.convert_to_tensor(targets, tf.string)), "target")
        allowed = None
        if self.constraint is not None and self.constraint.renormalize:  # scored as the search scores
            source_lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)  # [batch]
            max_lengths = self.options.longest_output(source_lengths, None, None, tf.minimum, tf.maximum)

            def allowed(targets):
                return self.constraint.allowed_along(targets, max_lengths)

        return score_ids(self.model, source_ids, target_ids, self.options.alpha if alpha is None else alpha, allowed)

    def _request_checks(self, request: DecodeRequest) -> list:
        """The graph's assertions that ``request`` (settings as scalar tensors) keeps its
        :meth:`~tf_transformer.decoding.request.DecodeRequest.limits`: the call fails with
        ``InvalidArgumentError`` naming the setting, in the words a Python check uses."""
        values = request.values(self.options)
        checks = []
        for limit in request.limits(self.options):
            value = values[limit.setting]
            if limit.op == "in":
                allowed = tf.reduce_any(tf.equal(value, limit.bound))
                check = tf.debugging.assert_equal(allowed, True, message=limit.message)
            else:
                bound = values[limit.bound] if isinstance(limit.bound, str) else tf.cast(limit.bound, value.dtype)
                check = _ASSERTIONS[limit.op](value, bound, message=limit.message)
            checks.append(check)
        return checks

    def _as_tensors(self, request: DecodeRequest) -> DecodeRequest:
        """``request`` resolved, with each of its settings a scalar tensor of its signature's dtype."""
        values = request.values(self.options)
        tensors = {name: tf.cast(value, SETTINGS[name].dtype) for name, value in values.items()}
        if request.sampling is None:
            return request.resolved(self.options).replace(**tensors)
        sampling = {name: tensors.pop(name) for name in DRAW_SETTINGS}
        return request.replace(sampling=Sampling(**sampling), **tensors)

    def translate_with_options(self, texts, target_prefix=None, request: DecodeRequest | None = None):
        """:meth:`translate` with a ``request`` whose settings may be scalar tensors: one graph serves any.

        The beam size must be one the graph compiled (:meth:`DecodeOptions.beam_sizes`:
        a search builds its beam into its shapes); every setting is held to
        :meth:`DecodeRequest.limits`, and one out of range fails the call with
        ``InvalidArgumentError`` naming it.

        Returns ``translations`` ``string[batch, nbest]``, ``scores``
        ``float32[batch, nbest]`` and ``ids`` ``int32[batch, nbest, len]`` (0-padded).
        """
        request = self._as_tensors(request or DecodeRequest())
        texts = tf.convert_to_tensor(texts, tf.string)
        source_ids, prefix_ids = self._encode(texts, target_prefix, self._request_checks(request))
        sizes = self.options.beam_sizes()
        widest = max(sizes)

        def search_with(size):
            def run():
                ids, scores, _ = self.search(source_ids, request.replace(beam_size=size), prefix_ids)
                pad = widest - size
                return tf.pad(ids, [[0, 0], [0, pad], [0, 0]]), tf.pad(scores, [[0, 0], [0, pad]])

            return run

        branch = tf.argmax(tf.cast(tf.equal(request.beam_size, sizes), tf.int32), output_type=tf.int32)
        ids, scores = tf.switch_case(branch, [search_with(size) for size in sizes])  # [batch, widest, len]
        return self._nbest(texts, ids, scores, request.nbest)

    def sample(self, texts, request: DecodeRequest):
        """Translations of ``texts`` drawn as ``request.sampling`` says, one each
        (:func:`~tf_transformer.decoding.sampling.sample_search`).

        Returns ``translations`` ``string[batch]`` and ``scores`` ``float32[batch]``,
        each output's log-probability under the model (not length-normalized).
        The settings may be scalar tensors; one out of range
        (:meth:`DecodeRequest.limits`) fails the call with ``InvalidArgumentError`` naming it.
        """
        if request.sampling is None:
            raise ValueError("sample() takes a DecodeRequest with its sampling settings (request.sampling)")
        options = self.options
        request = self._as_tensors(request)
        texts = tf.convert_to_tensor(texts, tf.string)
        source_ids, _ = self._encode(texts, checks=self._request_checks(request))
        sampling = request.sampling
        ids, log_probs = sample_search(
            self.model,
            source_ids,
            sampling.seed,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            max_extra_length=request.max_extra_length,
            max_output_length=options.max_output_length,
            min_length=options.min_length,
            decoding=self.decoding,
            weights=None if self.frozen_weights is None else self.frozen_weights.layers,
            constraint=self.constraint,
        )
        return blank_empty_inputs(texts, {"translations": self.tokenizer.detokenize_target(ids), "scores": log_probs})

    def translate_with_alignment(self, texts, layer: int):
        """:meth:`translate` (best only) with the best translation's alignment to its source.

        ``layer``: the decoder layer whose encoder–decoder attention (heads
        averaged) aligns, counting from 0 (negative: from the top). Returns, besides
        ``translations`` and ``scores``, ``alignments: string[batch]`` of
        source-target word pairs ``"i-j …"`` (:mod:`~tf_transformer.attention_views.alignment`),
        ``attention: float32[batch, out_len, src_len]`` over the pieces with EOS, and
        ``ids: int32[batch, out_len]``, the translation's pieces that label the
        attention's rows (0-padded; all 0 for an empty input). The attention comes
        from a teacher-forced pass over the translation after the search, which the
        search itself does not change.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        source_ids = self.limit_source(self.encode_strings(texts))  # [batch, src_len]
        ids, scores, _ = self.search(source_ids)
        best = ids[:, 0]  # [batch, out_len]
        attention = hypothesis_attention(self.model, source_ids, best, layer)  # [batch, out_len, src_len]
        pieces = self.tokenizer.pieces
        alignments = graph_word_alignment(attention, source_ids, best, pieces(source_ids), pieces(best))
        outputs = {
            "translations": self.tokenizer.detokenize_target(best),
            "scores": scores[:, 0],
            "alignments": alignments,
            "ids": best,
        }
        return {**blank_empty_inputs(texts, outputs), "attention": attention}


def blank_empty_inputs(texts, outputs: dict) -> dict:
    """``outputs`` (first axis: the sentences of ``texts``) with the rows of empty or all-whitespace inputs
    blanked: ``""`` for strings, 0 for numbers (the score of an empty output, PAD for its ids)."""
    empty = tf.equal(tf.strings.length(tf.strings.strip(texts)), 0)  # [batch]

    def blank(value):
        rows = tf.reshape(empty, [-1] + [1] * (value.shape.rank - 1))  # [batch, 1, …]
        return tf.where(rows, tf.zeros_like(value), value)

    return {key: blank(value) for key, value in outputs.items()}

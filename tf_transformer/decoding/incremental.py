"""The Transformer run one target position at a time over a cache (section 3's decoder, for search).

:class:`IncrementalDecoder` wraps a trained :class:`~tf_transformer.model.Transformer`
and computes, for each hypothesis's newest token, what the model's ``decode``
computes at that position, reusing everything earlier positions already
computed: the decoder's self-attention keys and values (the cache,
:mod:`tf_transformer.decoding.cache`), the encoder-decoder keys and values of
each sentence (once per search, shared by its hypotheses) and the decoder's
kernels laid out for few-row products (:mod:`tf_transformer.decoding.kernels`).
It reads the layers only through their documented attributes; no layer knows
about decoding.
"""

from __future__ import annotations

import tensorflow as tf
from keras import ops

from tf_transformer.decoding import cache as caching
from tf_transformer.decoding import cached_attention
from tf_transformer.decoding.kernels import attention_kernels, feed_forward_kernels, feed_forward_rows
from tf_transformer.decoding.packing import TokenPacking, encode_tokens


class IncrementalDecoder:
    """Cached incremental decoding with ``model`` (inference only; no dropout).

    Args:
      model: a built :class:`~tf_transformer.model.Transformer`.

    A search calls :meth:`encode` once, :meth:`constants` once, :meth:`empty_cache`
    once, then :meth:`first_step` for position 0 and :meth:`step` for every
    later position, reordering the cache with :meth:`reorder_cache` as
    hypotheses are chosen.
    """

    def __init__(self, model):
        self.model = model
        self.decoder = model.decoder

    def encode(self, source_ids):
        """``(memory [batch, src_len, d_model], memory_mask [batch, 1, 1, src_len])``, packed
        (:func:`~tf_transformer.decoding.packing.encode_tokens`)."""
        return encode_tokens(self.model, source_ids)

    def decoding_weights(self) -> list:
        """Every decoder layer's kernels laid out for decoding; they depend on the weights only.

        A translator that will not see new weights (an export) prepares them
        once and passes them to :meth:`constants`; otherwise they are prepared
        per search. The nesting (one dict per layer of ``self_attention``,
        ``cross_attention``, ``feed_forward``) is also the variable layout of an
        export's frozen weights.
        """
        return [
            {
                "self_attention": attention_kernels(layer.self_attention, self_attention=True),
                "cross_attention": attention_kernels(layer.cross_attention, self_attention=False),
                "feed_forward": feed_forward_kernels(layer.feed_forward),
            }
            for layer in self.decoder.decoder_layers
        ]

    def constants(self, memory, weights=None, memory_mask=None) -> dict:
        """What every step of one search reuses: the layers' memory keys and values, and their kernels.

        ``memory`` is ``[batch, src_len, d_model]``, not repeated per beam: the
        beams of a sentence share its encoder-decoder keys and values.
        ``"memory"`` holds every layer's, stacked (:func:`stack_memory`):
        ``"key"`` ``[layers, batch, heads, d_k, src_len]`` (transposed) and
        ``"value"`` ``[layers, batch, heads, src_len, d_v]``. ``"layers"``: the
        kernels from :meth:`decoding_weights` (by default prepared here, once
        per search, outside the decoding loop). With ``memory_mask`` ``[batch,
        1, 1, src_len]`` the keys and values are projected for the real
        positions only.
        """
        weights = self.decoding_weights() if weights is None else weights
        tokens = None if memory_mask is None else TokenPacking(memory_mask[:, 0, 0, :])
        projected = [
            cached_attention.project_key_value(layer.cross_attention, memory, tokens)
            for layer in self.decoder.decoder_layers
        ]  # per layer: keys [batch, heads, d_k, src_len], values [batch, heads, src_len, d_v]
        return {"memory": stack_memory(projected), "layers": list(weights)}

    def empty_cache(self, batch, max_length, dtype, beam_size=1):
        """:func:`~tf_transformer.decoding.cache.empty_cache` of this model's decoder."""
        return caching.empty_cache(self.decoder, batch, max_length, dtype, beam_size)

    @staticmethod
    def reorder_cache(cache, beams):
        """:func:`~tf_transformer.decoding.cache.reorder_cache`: only the history moves."""
        return caching.reorder_cache(cache, beams)

    def step(self, target_ids, cache, constants, memory_mask, step):
        """Ids ``[batch * size]`` at position ``step`` → ``(float32 logits [batch * size, vocab], cache)``.

        ``size`` hypotheses per sentence, consecutive. ``memory_mask`` is the
        ``[batch, 1, 1, src_len]`` source mask. The self-attention mask is built
        once here for all layers (:func:`~tf_transformer.decoding.cache.prefix_step`).
        """
        size = caching.hypotheses_per_sentence(cache["layers"][0])  # a Python int for a search's cache
        history = caching.write_history(cache["history"], size, step)  # [batch * size, max_len]
        where = caching.prefix_step(cache, history, step, size)
        return self._run(target_ids, cache, history, constants, where, memory_mask)

    def first_step(self, target_ids, cache, constants, memory_mask):
        """Position 0 once per sentence: ids ``[batch]`` → ``(float32 logits [batch, vocab], cache)``.

        Every hypothesis of a sentence starts from BOS with the same empty
        cache, so their step is one computation, run on one row per sentence
        instead of ``size``; the returned cache is what :meth:`step` writes at
        position 0 for every hypothesis.
        """
        size = caching.hypotheses_per_sentence(cache["layers"][0])
        history = caching.write_history(cache["history"], size, 0)  # [batch * size, max_len]
        where = caching.cache_step(cache, 0)
        return self._run(target_ids, cache, history, constants, where, memory_mask, first_of=size)

    def _run(self, target_ids, cache, history, constants, where, memory_mask, first_of=None):
        """Embedding, positions, every layer's step, the final norm and the tied projection."""
        model, decoder = self.model, self.decoder
        embedded = model.target_embedding(target_ids[:, None])  # [rows, 1, d_model]
        x = (embedded + decoder.position_layer(embedded, start_index=where.position)[None])[:, 0]  # [rows, d_model]
        layer_caches = []
        memories = layer_memories(constants["memory"], len(decoder.decoder_layers))
        for layer, layer_cache, kernels, memory in zip(
            decoder.decoder_layers, cache["layers"], constants["layers"], memories, strict=True
        ):
            x, layer_cache = layer_step(layer, x, layer_cache, kernels, memory, where, memory_mask, first_of)
            layer_caches.append(layer_cache)
        hidden = decoder.finish(x)  # [rows, d_model]
        logits = model.target_embedding(hidden, reverse=True)  # [rows, vocab]
        return logits, {"history": history, "layers": layer_caches}


# The sentences' axis of :func:`stack_memory`'s tensors (the first is the layers').
MEMORY_SENTENCES = 1


def stack_memory(layers) -> dict:
    """Every layer's memory keys and values ``[(keys, values), ...]`` as ``{"key", "value"}``, stacked on a
    first axis of layers.

    A decoding loop carries or captures each tensor at three ops a step: two
    stacked tensors, unstacked each step (:func:`layer_memories`, one ``Unpack``
    each), cost fewer ops than two per layer. Sentences are the second axis (:data:`MEMORY_SENTENCES`).
    """
    keys, values = zip(*layers, strict=True)
    return {"key": ops.stack(keys), "value": ops.stack(values)}


def layer_memories(memory, layers: int) -> list:
    """:func:`stack_memory`'s tensors → one ``{"key", "value"}`` per layer: ``Unpack`` of the first axis,
    whose outputs share the stacked buffers."""
    keys = tf.unstack(memory["key"], num=layers)  # [batch, heads, d_k, src_len] each
    values = tf.unstack(memory["value"], num=layers)  # [batch, heads, src_len, d_v] each
    return [{"key": key, "value": value} for key, value in zip(keys, values, strict=True)]


def layer_step(layer, x, cache, kernels, memory, where: caching.CacheStep, memory_mask, first_of=None):
    """One step of a :class:`~tf_transformer.layers.decoder.DecoderLayer` for ``size`` hypotheses per sentence.

    ``x`` is ``[batch * size, d_model]``, one row per hypothesis, at position
    ``where.position``. ``cache`` is this layer's self-attention cache (see
    :mod:`tf_transformer.decoding.cache`); ``where`` says which rows are
    written and which blocks are read, with ``where.mask`` marking the slots
    that hold each hypothesis's own prefix. ``kernels`` are this layer's from
    :meth:`IncrementalDecoder.decoding_weights`, ``memory`` its encoder-decoder
    keys and values (:func:`layer_memories`). Returns ``(output [batch * size,
    d_model], cache)``.

    ``first_of``: the first step (position 0) with one row per sentence
    standing for all ``first_of`` hypotheses of the cache. Its key and value
    fill every hypothesis's slot of position 0, and self-attention, which sees
    position 0 alone, is the value itself; ``where.mask`` is unused.
    """
    size = 1 if first_of is not None else caching.hypotheses_per_sentence(cache)  # rows per sentence
    updated = {}

    def self_attend(h):
        output, updated["cache"] = cached_attention.attend_with_cache(
            layer.self_attention, h, cache, kernels["self_attention"], where.mask, size, where, first_of
        )
        return output  # [batch * size, d_model]

    def cross_attend(h):
        output, _ = cached_attention.attend_with_cache(
            layer.cross_attention, h, memory, kernels["cross_attention"], memory_mask, size
        )  # the memory is static: read only
        return output  # [batch * size, d_model]

    sublayers = (
        (layer.self_attention_residual, self_attend),
        (layer.cross_attention_residual, cross_attend),
        (layer.feed_forward_residual, lambda h: feed_forward_rows(layer.feed_forward, h, kernels["feed_forward"])),
    )
    for residual, sublayer in sublayers:
        x = residual(x, sublayer=sublayer, training=False)  # [batch * size, d_model]
    return x, updated["cache"]

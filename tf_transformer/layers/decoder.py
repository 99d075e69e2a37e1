"""Decoder layer and decoder stack, section 3.1."""

from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf
from keras import ops

from tf_transformer import masks
from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.decoding_kernels import in_xla, project
from tf_transformer.layers.encoder import LayerStack, ResidualSublayer, _layer_kwargs
from tf_transformer.layers.feed_forward import PositionwiseFeedForward

# Positions per block of the decoding cache (see :meth:`Decoder.empty_cache`).
CACHE_BLOCK = 8


def new_slots(shape, dtype):
    """A zeroed cache tensor that :func:`write_slots` may update in place.

    ``tf.raw_ops.Empty`` is stateful: every call is a fresh buffer of its own,
    never a constant folded or shared with another layer's cache by graph
    optimization (writing in place into a shared buffer would corrupt them).
    """
    if in_xla():
        return ops.zeros(shape, dtype)
    return tf.raw_ops.Empty(shape=ops.stack(shape), dtype=dtype, init=True)


class CacheStep(NamedTuple):
    """Where one decoding step writes and reads every layer's cache (see :meth:`Decoder.decode_step`).

    The layers' caches share their addressing: built once per step by the
    decoder, so that no layer repeats the shape arithmetic (~48 scalar ops of a
    few microseconds each, over a third of a layer's ops in a step).
    """

    position: tf.Tensor  # int32 scalar: the position every hypothesis writes
    write_rows: tf.Tensor | None  # int32[batch * heads]: rows of write_slots' flat view (None under XLA)
    read_size: tf.Tensor | None  # int32[5]: tf.slice size of the blocks attention reads (None at position 0)
    mask: tf.Tensor | None  # bool [batch, 1, size, blocks read * slots]: each hypothesis's own prefix


def slot_rows(cache, position):
    """The rows of :func:`write_slots`' flat view that ``position`` takes, one per sentence and head.

    ``cache`` ``[blocks, batch, heads, CACHE_BLOCK * size, d]``: position ``p`` lives
    in block ``p // CACHE_BLOCK``, at row ``p % CACHE_BLOCK`` of its ``(batch, head)``.
    """
    _, batch, heads, _, _ = ops.shape(cache)
    return (
        (position // CACHE_BLOCK) * (batch * heads * CACHE_BLOCK)
        + ops.arange(batch * heads) * CACHE_BLOCK
        + position % CACHE_BLOCK
    )  # [batch * heads]


def write_slots(cache, new, position, rows):
    """``cache`` ``[blocks, batch, heads, block * size, d]`` with ``new`` ``[batch, heads, size, d]`` at ``position``.

    Position ``p`` lives in block ``p // block``, slots ``(p % block) * size``
    onwards. Viewed as rows of ``size * d`` (one per block, batch, head and
    position in the block), the write is ``InplaceUpdate`` of ``batch * heads``
    rows, ``rows`` (:func:`slot_rows` of ``position``; unused, and ``None``, under
    XLA): it changes the buffer in place instead of copying the whole cache
    every step, as ``ops.slice_update`` (an XLA op compiled on demand) does
    outside XLA. The cache passed in must come from :func:`new_slots` or an
    earlier write and must not be used again: only the returned tensor is
    valid. Under XLA, which has no ``InplaceUpdate`` kernel and updates loop
    buffers in place itself, this is ``ops.slice_update``.
    """
    _, _, size, depth = ops.shape(new)
    if in_xla():
        block = ops.shape(cache)[3] // size
        return ops.slice_update(cache, (position // block, 0, 0, (position % block) * size, 0), new[None])
    width = size * depth  # a constant when the beam size and depth are
    flat = tf.reshape(cache, [-1, width])  # [blocks * batch * heads * block, size * d]
    flat = tf.raw_ops.InplaceUpdate(x=flat, i=rows, v=tf.reshape(new, [-1, width]))
    return tf.reshape(flat, tf.shape(cache))


def first_blocks(cache, size):
    """The first blocks of ``cache`` ``[max_blocks, batch, heads, slots, d]``, without a copy.

    ``size`` is ``[blocks, -1, -1, -1, -1]`` (:attr:`CacheStep.read_size`).
    A slice of the first dimension only: TensorFlow's ``Slice`` kernel returns
    a view of the same buffer, where slicing the positions of a
    ``[batch, heads, positions, d]`` cache copied the prefix at every step.
    """
    view = tf.slice(cache, [0, 0, 0, 0, 0], size)
    view.set_shape([None, *cache.shape[1:]])  # only the number of blocks varies: keep the static dimensions
    return view


def hypotheses_per_sentence(cache):
    """``size`` of a layer cache ``[blocks, batch, heads, CACHE_BLOCK * size, d]``: a Python int when static."""
    return ops.shape(cache)[3] // CACHE_BLOCK


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(keras.layers.Layer):
    """Masked self-attention, encoder-decoder attention, FFN (section 3.1).

    "In addition to the two sub-layers in each encoder layer, the decoder inserts
    a third sub-layer, which performs multi-head attention over the output of the
    encoder stack." Each sub-layer is wrapped residually as in the encoder.

    Args: as :class:`~tf_transformer.layers.encoder.EncoderLayer`.

    Call args:
      x: ``[batch, tgt_len, d_model]``.
      memory: ``[batch, src_len, d_model]`` encoder output.
      self_attention_mask: ``[batch, 1, tgt_len, tgt_len]`` (causal and padding).
      memory_mask: ``[batch, 1, 1, src_len]`` source padding mask.

    Returns:
      ``[batch, tgt_len, d_model]``.
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        relu_dropout: float = 0.0,
        pre_norm: bool = False,
        layer_norm_epsilon: float = 1e-6,
        attention_bias: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.pre_norm = pre_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention_bias = attention_bias
        residual = dict(dropout=dropout, pre_norm=pre_norm, layer_norm_epsilon=layer_norm_epsilon)
        policy = self.dtype_policy
        self.self_attention = MultiHeadAttention(
            num_heads,
            key_dim,
            value_dim,
            dropout=attention_dropout,
            use_bias=attention_bias,
            dtype=policy,
            name="self_attention",
        )
        self.self_attention_residual = ResidualSublayer(**residual, dtype=policy, name="self_attention_residual")
        self.cross_attention = MultiHeadAttention(
            num_heads,
            key_dim,
            value_dim,
            dropout=attention_dropout,
            use_bias=attention_bias,
            dtype=policy,
            name="cross_attention",
        )
        self.cross_attention_residual = ResidualSublayer(**residual, dtype=policy, name="cross_attention_residual")
        self.feed_forward = PositionwiseFeedForward(d_ff, relu_dropout=relu_dropout, dtype=policy, name="feed_forward")
        self.feed_forward_residual = ResidualSublayer(**residual, dtype=policy, name="feed_forward_residual")

    def build(self, x_shape, memory_shape):
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_residual.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        self.cross_attention_residual.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_residual.build(x_shape)

    def call(self, x, memory, self_attention_mask=None, memory_mask=None, training=None):
        x = self.self_attention_residual(
            x,
            sublayer=lambda h: self.self_attention(h, h, attention_mask=self_attention_mask, training=training),
            training=training,
        )  # [batch, tgt_len, d_model]
        x = self.cross_attention_residual(
            x,
            sublayer=lambda h: self.cross_attention(h, memory, attention_mask=memory_mask, training=training),
            training=training,
        )  # [batch, tgt_len, d_model]
        return self.feed_forward_residual(
            x, sublayer=lambda h: self.feed_forward(h, training=training), training=training
        )  # [batch, tgt_len, d_model]

    def compute_output_shape(self, x_shape, memory_shape):
        return x_shape

    def decoding_weights(self) -> dict:
        """This layer's kernels laid out for :meth:`decode_step` (``decoding_weights`` of its sublayers)."""
        return {
            "self_attention": self.self_attention.decoding_weights(self_attention=True),
            "cross_attention": self.cross_attention.decoding_weights(self_attention=False),
            "feed_forward": self.feed_forward.decoding_weights(),
        }

    def decoding_constants(self, memory, weights, tokens=None):
        """What :meth:`decode_step` reuses at every step of one search (inference only).

        ``memory_key`` / ``memory_value``: the encoder-decoder keys and values
        of ``memory`` ``[batch, src_len, d_model]`` split into heads, computed
        once per sentence and shared by its hypotheses (the keys transposed,
        ``[batch, heads, d_k, src_len]``; with ``tokens``, a
        :class:`~tf_transformer.masks.TokenPacking`, for the real positions
        only); and this layer's kernels laid out for decoding, ``weights``
        (from :meth:`decoding_weights`).
        """
        memory_key, memory_value = self.cross_attention.project_key_value(memory, tokens=tokens)
        # memory_key: [batch, heads, d_k, src_len]; memory_value: [batch, heads, src_len, d_v]
        return {"memory_key": memory_key, "memory_value": memory_value, **weights}

    def decode_step(self, x, cache, constants, cache_step, memory_mask, first_of=None):
        """One incremental step (inference) of ``size`` hypotheses per sentence.

        ``x`` is ``[batch * size, d_model]``, one row per hypothesis, at
        position ``cache_step.position``. ``cache`` holds this layer's self-attention keys and
        values per sentence in fixed-shape blocks of positions, ``[blocks,
        batch, heads, block * size, d_k]`` (``d_v`` for values): hypothesis
        ``k`` writes its key and value of position ``p`` into block ``p //
        block``, slot ``(p % block) * size + k``. ``cache_step`` (a
        :class:`CacheStep`) says where: the rows written, and the first
        blocks attention reads, with ``cache_step.mask`` ``[batch, 1, size,
        blocks_read * block * size]`` (the blocks' slots end to end) marking the
        slots that hold each hypothesis's own prefix (see :meth:`Decoder.decode_step`).
        ``constants`` come from :meth:`decoding_constants`. Returns
        ``(output [batch * size, d_model], cache)``.

        ``first_of``: the first step (position 0) with one row per sentence
        standing for all ``first_of`` hypotheses of the cache (see
        :meth:`Decoder.decode_first_step`). Its key and value fill every
        hypothesis's slot of position 0, and self-attention, which sees
        position 0 alone, is the value itself; ``cache_step.mask`` is unused.
        """
        attention = self.self_attention
        size = 1 if first_of is not None else hypotheses_per_sentence(cache["key"])  # rows per sentence
        self_kernels = constants["self_attention"]
        updated = {}

        def self_attend(h):
            projected = project(h, self_kernels["input"])  # [batch * size, h·d_k + h·d_k + h·d_v]
            query, new_key, new_value = attention.split_query_key_value(projected, size)  # [batch, heads, size, d]
            for name, new in (("key", new_key), ("value", new_value)):
                if first_of is not None:  # one row per sentence fills every hypothesis's slot
                    new = ops.repeat(new, first_of, axis=2)  # [batch, heads, first_of, d]
                updated[name] = write_slots(
                    cache[name], ops.cast(new, cache[name].dtype), cache_step.position, cache_step.write_rows
                )
            if first_of is not None:  # position 0 sees itself alone: its value is the output
                return attention.attend_to_itself(new_value, self_kernels)  # [batch, d_model]
            key = first_blocks(updated["key"], cache_step.read_size)  # [blocks, batch, heads, block * size, d_k]
            value = first_blocks(updated["value"], cache_step.read_size)  # [blocks, batch, heads, block * size, d_v]
            return attention.attend(query, key, value, self_kernels, cache_step.mask)

        def cross_attend(h):
            kernels = constants["cross_attention"]
            query = self.cross_attention.group_heads(
                project(h, kernels["input"]), size, self.cross_attention.key_dim
            )  # [batch, heads, size, d_k]
            return self.cross_attention.attend(
                query, constants["memory_key"], constants["memory_value"], kernels, memory_mask
            )  # [batch * size, d_model]

        sublayers = (
            (self.self_attention_residual, self_attend),
            (self.cross_attention_residual, cross_attend),
            (self.feed_forward_residual, lambda h: self.feed_forward.decode_rows(h, constants["feed_forward"])),
        )
        for residual, sublayer in sublayers:
            x = residual(x, sublayer=sublayer, training=False)  # [batch * size, d_model]
        return x, updated

    def get_config(self):
        config = super().get_config()
        config.update(_layer_kwargs(self))
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
    """The decoder stack: positions, dropout, then N decoder layers (section 3.1).

    Takes the scaled target embeddings (shifted right: BOS first) and returns
    the final hidden states; the model projects them with the shared embedding.

    Args: as :class:`~tf_transformer.layers.encoder.Encoder`.

    Call args:
      embedded: ``[batch, tgt_len, d_model]``.
      memory: ``[batch, src_len, d_model]`` encoder output.
      self_attention_mask: ``[batch, 1, tgt_len, tgt_len]``.
      memory_mask: ``[batch, 1, 1, src_len]``.

    Returns:
      ``[batch, tgt_len, d_model]``.
    """

    layer_class = DecoderLayer
    layers_attribute = "decoder_layers"

    def build(self, embedded_shape, memory_shape):
        self.position_layer.build(embedded_shape)
        for layer in self.decoder_layers:
            layer.build(embedded_shape, memory_shape)
        if self.final_norm is not None:
            self.final_norm.build(embedded_shape)

    def call(self, embedded, memory, self_attention_mask=None, memory_mask=None, training=None):
        x = embedded + self.position_layer(embedded)[None]  # [batch, tgt_len, d_model]
        x = self.embedding_dropout(x, training=training)
        for layer in self.decoder_layers:
            x = layer(
                x, memory, self_attention_mask=self_attention_mask, memory_mask=memory_mask, training=training
            )  # [batch, tgt_len, d_model]
        return self._finish(x)

    def compute_output_shape(self, embedded_shape, memory_shape):
        return embedded_shape

    def decoding_weights(self) -> list:
        """Every layer's kernels laid out for :meth:`decode_step`; they depend on the weights only.

        A translator that will not see new weights (an export) prepares them
        once and passes them to :meth:`decoding_constants`; otherwise they are
        prepared per search (see :mod:`tf_transformer.layers.decoding_kernels`).
        """
        return [layer.decoding_weights() for layer in self.decoder_layers]

    def decoding_constants(self, memory, weights=None, memory_mask=None):
        """Every layer's per-search constants for :meth:`decode_step` (inference only).

        ``memory`` is ``[batch, src_len, d_model]``, not repeated per beam: the
        beams of a sentence share its encoder-decoder keys and values (see
        ``MultiHeadAttention.attend``). ``weights`` come from
        :meth:`decoding_weights`; by default they are prepared here, once per
        search, outside the decoding loop. With ``memory_mask`` ``[batch, 1, 1,
        src_len]`` the keys and values are projected for the real positions only.
        """
        weights = self.decoding_weights() if weights is None else weights
        tokens = None if memory_mask is None else masks.TokenPacking(memory_mask[:, 0, 0, :])
        return [
            layer.decoding_constants(memory, layer_weights, tokens)
            for layer, layer_weights in zip(self.decoder_layers, weights, strict=True)
        ]

    def empty_cache(self, batch, max_length, dtype, beam_size=1):
        """The decoding cache of ``batch`` sentences × ``beam_size`` hypotheses, fixed-shape.

        Positions are stored in blocks of ``CACHE_BLOCK``; ``max_length`` is
        rounded up to whole blocks. ``history`` ``int32[batch * beam_size,
        blocks * block]``: for each hypothesis and position, which hypothesis of
        its sentence wrote the key and value of that position of its prefix.
        ``layers``: one ``{"key", "value"}`` per layer, ``[blocks, batch, heads,
        block * beam_size, d_k]`` (``d_v``); position ``p`` of hypothesis ``k``
        is block ``p // block``, slot ``(p % block) * beam_size + k``. Reading
        the blocks written so far is a view of the first axis, so no step
        copies the prefix.
        """
        blocks = (max_length + CACHE_BLOCK - 1) // CACHE_BLOCK
        slots = CACHE_BLOCK * beam_size
        return {
            "history": ops.zeros((batch * beam_size, blocks * CACHE_BLOCK), "int32"),
            "layers": [
                {
                    "key": new_slots((blocks, batch, self.num_heads, slots, self.key_dim), dtype),
                    "value": new_slots((blocks, batch, self.num_heads, slots, self.value_dim), dtype),
                }
                for _ in self.decoder_layers
            ],
        }

    def reorder_cache(self, cache, beams):
        """Hypothesis ``k`` of sentence ``b`` continues ``beams[b, k]`` (``int[batch, size]``).

        Only the small ``history`` moves: keys and values stay in their slots,
        so beam search copies no per-layer tensor (Vaswani et al. decode with
        beam 4, section 6.1; reordering the full cache each step dominated).
        """
        groups, size = ops.shape(beams)[0], ops.shape(beams)[1]
        rows = ops.reshape(ops.cast(beams, "int32") + ops.arange(groups)[:, None] * size, (-1,))  # [batch * size]
        return {"history": ops.take(cache["history"], rows, axis=0), "layers": cache["layers"]}

    def decode_step(self, embedded, cache, constants, memory_mask, step):
        """``embedded`` ``[batch * size, 1, d_model]`` at position ``step`` → ``([batch * size, d_model], cache)``.

        ``constants`` come from :meth:`decoding_constants`; ``memory_mask`` is
        the ``[batch, 1, 1, src_len]`` source mask. The self-attention mask is
        built once here for all layers: hypothesis ``k`` sees the slot of
        position ``l`` written by hypothesis ``k'`` when ``l <= step`` and its
        prefix's token ``l`` was written by ``k'``. Only the blocks holding
        positions ``0..step`` are attended to (about half the self-attention
        work of the whole cache); under XLA, which needs static shapes, all
        are, with the unwritten positions masked.
        """
        size = hypotheses_per_sentence(cache["layers"][0]["key"])  # a Python int for a search's cache
        history = self._write_history(cache["history"], size, step)  # [batch * size, max_len]
        max_len = ops.shape(history)[1]
        positions = ops.arange(max_len)  # [max_len]
        blocks = max_len // CACHE_BLOCK if in_xla() else step // CACHE_BLOCK + 1
        seen = blocks * CACHE_BLOCK
        visible = ops.logical_and(
            history[:, :seen, None] == ops.arange(size)[None, None, :], (positions[:seen] <= step)[None, :, None]
        )  # [batch * size, seen, size]
        # Hypothesis-major rows, then position-major slots: the blocks' slots end to end.
        self_mask = ops.reshape(visible, (-1, 1, size, seen * size))  # [batch, 1, size, blocks * slots]
        cache_step = self._cache_step(cache, step, ops.stack([blocks, -1, -1, -1, -1]), self_mask)
        x, layer_caches = self._layers_step(embedded, cache, constants, cache_step, memory_mask)
        return x, {"history": history, "layers": layer_caches}

    def decode_first_step(self, embedded, cache, constants, memory_mask):
        """Step 0 once per sentence: ``embedded`` ``[batch, 1, d_model]`` → ``([batch, d_model], cache)``.

        At position 0 every hypothesis of a sentence holds BOS and an empty
        cache, so their step is one computation; beam search runs it on one
        row per sentence instead of ``size`` (see ``beam_search``'s
        ``first_step_fn``). ``cache`` is :meth:`empty_cache`'s; the returned
        cache is what :meth:`decode_step` writes at step 0 for every
        hypothesis, with the same results.
        """
        size = hypotheses_per_sentence(cache["layers"][0]["key"])
        history = self._write_history(cache["history"], size, 0)  # [batch * size, max_len]
        cache_step = self._cache_step(cache, 0)
        x, layer_caches = self._layers_step(embedded, cache, constants, cache_step, memory_mask, first_of=size)
        return x, {"history": history, "layers": layer_caches}

    def _write_history(self, history, size, step):
        """``history`` ``[batch * size, max_len]`` with position ``step`` written by each hypothesis itself."""
        own = (ops.arange(ops.shape(history)[0]) % size)[:, None]  # [batch * size, 1]
        positions = ops.arange(ops.shape(history)[1])  # [max_len]
        return ops.where(positions[None, :] == step, own, history)

    def _cache_step(self, cache, position, read_size=None, mask=None):
        """The :class:`CacheStep` of ``position`` for every layer: its write rows computed once."""
        rows = None if in_xla() else slot_rows(cache["layers"][0]["key"], position)  # [batch * heads]
        return CacheStep(position, rows, read_size, mask)

    def _layers_step(self, embedded, cache, constants, cache_step, memory_mask, first_of=None):
        """Positions, every layer's :meth:`DecoderLayer.decode_step`, the final norm: ``(x, layer caches)``."""
        step = cache_step.position
        x = (embedded + self.position_layer(embedded, start_index=step)[None])[:, 0]  # [rows, d_model]
        layer_caches = []
        for layer, layer_cache, layer_constants in zip(self.decoder_layers, cache["layers"], constants, strict=True):
            x, layer_cache = layer.decode_step(
                x, layer_cache, layer_constants, cache_step, memory_mask, first_of=first_of
            )  # [rows, d_model]
            layer_caches.append(layer_cache)
        return self._finish(x), layer_caches

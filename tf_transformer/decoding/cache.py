"""The decoder's self-attention cache: fixed-shape blocks of positions, written in place.

A search of ``batch`` sentences × ``size`` hypotheses keeps, per decoder layer,
keys ``[blocks, batch, heads, CACHE_BLOCK * size, d_k]`` and values (``d_v``).
Hypothesis ``k`` writes its key and value of position ``p`` into block
``p // CACHE_BLOCK``, slot ``(p % CACHE_BLOCK) * size + k``, and never moves
them: when beam search reorders hypotheses only ``history`` (which hypothesis
wrote each position of a prefix) moves, and each hypothesis's attention mask
picks its own prefix out of the slots. Reading the blocks written so far is a
view of the first axis, so no step copies the prefix.

When ``d_k == d_v`` (every preset but Table 3's row B) a layer's keys and
values are one tensor, ``"key_value"`` ``[2 * blocks, ...]``: keys in the first
``blocks`` blocks, values in the next. A step then writes them with one op and
the loop carries one tensor a layer, not two (a carried tensor costs three ops
a step). Otherwise they are ``"key"`` and ``"value"``. docs/design/decoding.md
says why each of these exists.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf
from keras import ops

from tf_transformer.decoding.xla import in_xla

# Positions per block of the cache.
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
    """Where one decoding step writes and reads every layer's cache.

    The layers' caches share their addressing: built once per step, so that no
    layer repeats the shape arithmetic.
    """

    position: tf.Tensor  # int32 scalar: the position every hypothesis writes
    write_rows: tf.Tensor | None  # int32[parts * batch * heads]: rows of write_slots' flat view (None under XLA)
    read_size: tf.Tensor | None  # int32[5]: tf.slice size of the blocks attention reads (None at position 0)
    mask: tf.Tensor | None  # bool [batch, 1, size, blocks read * slots]: each hypothesis's own prefix
    # int32[4], int32[5]: blocked attention's scores [batch, heads, size, blocks read * slots] and by block
    # [batch, heads, size, blocks read, slots] (None at position 0)
    score_shapes: tuple | None = None


def slot_rows(cache, position, parts=1):
    """The rows of :func:`write_slots`' flat view that ``position`` takes, one per part, sentence and head.

    ``cache`` ``[parts * blocks, batch, heads, CACHE_BLOCK * size, d]``: in each
    part (keys, values), position ``p`` lives in block ``p // CACHE_BLOCK``, at
    row ``p % CACHE_BLOCK`` of its ``(batch, head)``.
    """
    all_blocks, batch, heads, _, _ = ops.shape(cache)
    rows_per_block = batch * heads * CACHE_BLOCK
    rows = (
        (position // CACHE_BLOCK) * rows_per_block + ops.arange(batch * heads) * CACHE_BLOCK + position % CACHE_BLOCK
    )  # [batch * heads]
    if parts == 1:
        return rows
    part = (all_blocks // parts) * rows_per_block  # rows in a part
    return ops.concatenate([rows] + [rows + i * part for i in range(1, parts)], axis=0)  # [parts * batch * heads]


def write_slots(cache, new, position, rows):
    """``cache`` ``[parts * blocks, batch, heads, block * size, d]`` with ``new`` ``[parts, batch, heads, size, d]``
    at ``position``.

    In each part, position ``p`` lives in block ``p // block``, slots ``(p % block) * size``
    onwards. Viewed as rows of ``size * d`` (one per block, batch, head and
    position in the block), the write is ``InplaceUpdate`` of ``parts * batch * heads``
    rows, ``rows`` (:func:`slot_rows` of ``position``; unused, and ``None``, under
    XLA): it changes the buffer in place instead of copying the whole cache
    every step, as ``ops.slice_update`` does outside XLA. The cache passed in
    must come from :func:`new_slots` or an earlier write and must not be used
    again: only the returned tensor is valid. Under XLA, which has no
    ``InplaceUpdate`` kernel and updates loop buffers in place itself, this is
    ``ops.slice_update``, once per part.
    """
    parts, _, _, size, depth = ops.shape(new)
    if in_xla():
        block = ops.shape(cache)[3] // size
        blocks = ops.shape(cache)[0] // parts
        for part in range(parts):
            start = (part * blocks + position // block, 0, 0, (position % block) * size, 0)
            cache = ops.slice_update(cache, start, new[part : part + 1])
        return cache
    width = size * depth  # a constant when the beam size and depth are
    flat = tf.reshape(cache, [-1, width])  # [blocks * batch * heads * block, size * d]
    flat = tf.raw_ops.InplaceUpdate(x=flat, i=rows, v=tf.reshape(new, [-1, width]))
    return tf.reshape(flat, tf.shape(cache))


def first_blocks(cache, size):
    """The first blocks of ``cache`` ``[max_blocks, batch, heads, slots, d]``, without a copy.

    ``size`` is ``[blocks, -1, -1, -1, -1]`` (:attr:`CacheStep.read_size`).
    A slice of the first dimension only: TensorFlow's ``Slice`` kernel returns
    a view of the same buffer, where slicing the positions of a
    ``[batch, heads, positions, d]`` cache would copy the prefix at every step.
    """
    view = tf.slice(cache, [0, 0, 0, 0, 0], size)
    view.set_shape([None, *cache.shape[1:]])  # only the number of blocks varies: keep the static dimensions
    return view


def _first_tensor(layer):
    """A layer cache's first tensor: every tensor of every layer is laid out alike
    (``[parts * blocks, batch, heads, CACHE_BLOCK * size, d]``)."""
    return next(iter(layer.values()))


def hypotheses_per_sentence(layer):
    """``size`` of a layer's cache (``[parts * blocks, batch, heads, CACHE_BLOCK * size, d]`` each): a Python int
    when static."""
    return ops.shape(_first_tensor(layer))[3] // CACHE_BLOCK


def _parts(name):
    """How many of keys and values the cache tensor ``name`` holds."""
    return 2 if name == "key_value" else 1


def layer_slots(blocks, batch, heads, slots, key_dim, value_dim, dtype):
    """One layer's empty cache of ``blocks`` blocks of ``slots``: ``{"key_value"}`` when ``key_dim == value_dim``,
    else ``{"key", "value"}`` (see the module docstring)."""
    if key_dim == value_dim:
        return {"key_value": new_slots((2 * blocks, batch, heads, slots, key_dim), dtype)}
    return {
        "key": new_slots((blocks, batch, heads, slots, key_dim), dtype),
        "value": new_slots((blocks, batch, heads, slots, value_dim), dtype),
    }


def write_layer(layer, new, where: CacheStep, first_of=None):
    """``layer``'s cache with a step's keys and values written at ``where.position``.

    ``new`` holds them as the cache does: ``"key_value"`` ``[2, groups, heads,
    size, d]`` or ``"key"`` and ``"value"`` ``[1, groups, heads, size, d_k | d_v]``
    (:func:`~tf_transformer.decoding.cached_attention.split_query_key_value`).
    ``first_of``: one row per sentence (``size`` 1) fills the slots of all
    ``first_of`` hypotheses. Used linearly, as :func:`write_slots`.
    """
    written = {}
    for name, slots in layer.items():
        part = new[name]  # [parts, groups, heads, size, d]
        if first_of is not None:
            part = ops.repeat(part, first_of, axis=3)  # [parts, groups, heads, first_of, d]
        written[name] = write_slots(slots, ops.cast(part, slots.dtype), where.position, where.write_rows)
    return written


def read_layer(layer, where: CacheStep):
    """``(keys, values)`` of the blocks ``where`` reads, ``[blocks read, groups, heads, slots, d]``: views, not copies.

    The two halves of a joined cache come from ``Split`` of its first axis, which, like
    :func:`first_blocks`, shares the buffer.
    """
    if "key_value" in layer:
        keys, values = tf.split(layer["key_value"], 2, axis=0)  # [blocks, groups, heads, slots, d] each
    else:
        keys, values = layer["key"], layer["value"]
    return first_blocks(keys, where.read_size), first_blocks(values, where.read_size)


def empty_cache(decoder, batch, max_length, dtype, beam_size=1):
    """The cache of ``decoder`` (a :class:`~tf_transformer.layers.decoder.Decoder`) for ``batch`` sentences
    × ``beam_size`` hypotheses.

    ``max_length`` is rounded up to whole blocks. ``history`` ``int32[batch *
    beam_size, blocks * block]``: for each hypothesis and position, which
    hypothesis of its sentence wrote the key and value of that position of its
    prefix. ``layers``: one :func:`layer_slots` per layer (see the module docstring).
    """
    blocks = (max_length + CACHE_BLOCK - 1) // CACHE_BLOCK
    slots = CACHE_BLOCK * beam_size
    return {
        "history": ops.zeros((batch * beam_size, blocks * CACHE_BLOCK), "int32"),
        "layers": [
            layer_slots(blocks, batch, decoder.num_heads, slots, decoder.key_dim, decoder.value_dim, dtype)
            for _ in decoder.decoder_layers
        ],
    }


def reorder_cache(cache, beams):
    """Hypothesis ``k`` of sentence ``b`` continues ``beams[b, k]`` (``int[batch, size]``).

    Only the small ``history`` moves: keys and values stay in their slots, so
    beam search copies no per-layer tensor.
    """
    groups, size = ops.shape(beams)[0], ops.shape(beams)[1]
    rows = ops.reshape(ops.cast(beams, "int32") + ops.arange(groups)[:, None] * size, (-1,))  # [batch * size]
    return {"history": ops.take(cache["history"], rows, axis=0), "layers": cache["layers"]}


def write_history(history, size, step):
    """``history`` ``[batch * size, max_len]`` with position ``step`` written by each hypothesis itself."""
    own = (ops.arange(ops.shape(history)[0]) % size)[:, None]  # [batch * size, 1]
    positions = ops.arange(ops.shape(history)[1])  # [max_len]
    return ops.where(positions[None, :] == step, own, history)


def cache_step(cache, position, read_size=None, mask=None, score_shapes=None) -> CacheStep:
    """The :class:`CacheStep` of ``position`` for every layer: its write rows computed once."""
    rows = None
    if not in_xla():
        name, slots = next(iter(cache["layers"][0].items()))  # every layer's tensors are laid out alike
        rows = slot_rows(slots, position, _parts(name))  # [parts * batch * heads]
    return CacheStep(position, rows, read_size, mask, score_shapes)


def prefix_step(cache, history, step, size) -> CacheStep:
    """The :class:`CacheStep` of ``step`` > 0, with each hypothesis's mask over the blocks it reads.

    Hypothesis ``k`` sees the slot of position ``l`` written by hypothesis
    ``k'`` when ``l <= step`` and its prefix's token ``l`` was written by
    ``k'`` (``history``, already written at ``step``; ``size`` hypotheses per
    sentence, :func:`hypotheses_per_sentence`). Only the blocks holding
    positions ``0..step`` are read; under XLA, which needs static shapes, all
    are, with the unwritten positions masked.
    """
    max_len = ops.shape(history)[1]
    positions = ops.arange(max_len)  # [max_len]
    blocks = max_len // CACHE_BLOCK if in_xla() else step // CACHE_BLOCK + 1
    seen = blocks * CACHE_BLOCK
    visible = ops.logical_and(
        history[:, :seen, None] == ops.arange(size)[None, None, :], (positions[:seen] <= step)[None, :, None]
    )  # [batch * size, seen, size]
    # Hypothesis-major rows, then position-major slots: the blocks' slots end to end.
    width = seen * size  # blocks * slots
    mask = ops.reshape(visible, (-1, 1, size, width))  # [batch, 1, size, blocks * slots]
    heads, slots = ops.shape(_first_tensor(cache["layers"][0]))[2:4]  # static
    shapes = (ops.stack([-1, heads, size, width]), ops.stack([-1, heads, size, blocks, slots]))
    return cache_step(cache, step, ops.stack([blocks, -1, -1, -1, -1]), mask, shapes)


def select_sentences(cache, keep, position):
    """The cache of sentences ``keep`` (``int32[n]``, indices into the batch, in that order) only.

    A search drops the sentences whose hypotheses are final so that later steps
    compute only the others. The blocks written before ``position`` are copied;
    the later ones are new zeroed blocks, so the result is a fresh buffer that
    :func:`write_slots` may update in place.
    """
    size = hypotheses_per_sentence(cache["layers"][0])
    rows = ops.reshape(keep[:, None] * size + ops.arange(size)[None, :], (-1,))  # [n * size]
    layers = []
    for layer in cache["layers"]:
        selected = {}
        for name, slots in layer.items():
            parts = _parts(name)
            shape = ops.shape(slots)
            blocks = shape[0] // parts
            written = ops.minimum(position // CACHE_BLOCK + 1, blocks)
            by_part = tf.reshape(slots, tf.concat([[parts, -1], tf.shape(slots)[1:]], axis=0))
            # by_part: [parts, blocks, batch, heads, width, d]
            kept = tf.gather(by_part[:, :written], keep, axis=2)  # [parts, written, n, heads, width, d]
            _, _, heads, width, depth = shape
            unwritten = new_slots(
                (parts, blocks - written, ops.shape(keep)[0], heads, width, depth), slots.dtype
            )  # [parts, blocks - written, n, heads, width, d]: zeros
            fresh = ops.concatenate([kept, unwritten], axis=1)  # [parts, blocks, n, heads, width, d]
            fresh = tf.reshape(fresh, ops.stack([shape[0], ops.shape(keep)[0], heads, width, depth]))
            fresh.set_shape([slots.shape[0], None, *slots.shape[2:]])  # [parts * blocks, n, heads, width, d]
            selected[name] = fresh
        layers.append(selected)
    return {"history": ops.take(cache["history"], rows, axis=0), "layers": layers}


def sentence_shapes(cache):
    """``cache``'s static shapes with the sentences' axis unknown: a search loop's shape invariants."""

    def relaxed(x, axis):
        shape = x.shape.as_list()
        shape[axis] = None
        return tf.TensorShape(shape)

    return {
        "history": relaxed(cache["history"], 0),
        "layers": [{name: relaxed(slots, 1) for name, slots in layer.items()} for layer in cache["layers"]],
    }

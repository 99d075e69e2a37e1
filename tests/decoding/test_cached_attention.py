"""Eq. 1 over the decoding cache's blocks and over transposed memory keys; attention over a cache as the layer's."""

import numpy as np
import pytest
import tensorflow as tf

from tests.layers.test_attention import np_attention
from tf_transformer.decoding import cache as caching
from tf_transformer.decoding.cached_attention import (
    attend_with_cache,
    blocked_attention,
    few_row_softmax,
    project_key_value,
    transpose,
    transposed_key_attention,
)
from tf_transformer.decoding.kernels import attention_kernels
from tf_transformer.layers.attention import MultiHeadAttention

RNG = np.random.default_rng(2)


def test_blocked_attention_equals_attention_over_the_blocks_laid_end_to_end():
    """The decoding cache's blocks of positions: one softmax across all blocks, as eq. 1 over their concatenation."""
    blocks, groups, heads, size, slots = 3, 2, 4, 5, 6
    q = RNG.normal(size=(groups, heads, size, 8)).astype("float32")
    k = RNG.normal(size=(blocks, groups, heads, slots, 8)).astype("float32")
    v = RNG.normal(size=(blocks, groups, heads, slots, 3)).astype("float32")
    mask = RNG.random((blocks, groups, 1, size, slots)) < 0.6
    mask[0, ..., 0] = True  # every query sees at least one key
    joined_mask = np.concatenate(list(mask), -1)  # [groups, 1, size, blocks * slots]: the blocks end to end
    output = np.asarray(blocked_attention(q, k, v, joined_mask))
    # The blocks joined along the key axis.
    expected, _ = np_attention(q, np.concatenate(list(k), -2), np.concatenate(list(v), -2), joined_mask)
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


def test_transposed_key_attention_equals_attention():
    """Keys stored transposed once per search give eq. 1's output."""
    q = RNG.normal(size=(2, 4, 3, 8)).astype("float32")
    k = RNG.normal(size=(2, 4, 7, 8)).astype("float32")
    v = RNG.normal(size=(2, 4, 7, 5)).astype("float32")
    mask = np.ones((2, 1, 1, 7), bool)
    mask[1, ..., 4:] = False  # the second sentence is shorter
    output = np.asarray(transposed_key_attention(q, np.swapaxes(k, -1, -2), v, mask))
    expected, _ = np_attention(q, k, v, mask)
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


def attention_layer(key_dim=4, value_dim=3):
    layer = MultiHeadAttention(num_heads=2, key_dim=key_dim, value_dim=value_dim, use_bias=True)
    layer.build((None, None, 6), (None, None, 6))
    for weight in layer.weights:  # biases too, so that a missing one shows
        weight.assign(RNG.normal(size=weight.shape, scale=0.5).astype("float32"))
    return layer


def test_attending_over_a_static_cache_equals_the_layer():
    """Encoder-decoder attention of each sentence's hypotheses over its memory: the layer's call, row by row."""
    groups, size, src_len = 2, 3, 5
    layer = attention_layer()
    rows = RNG.normal(size=(groups * size, 6)).astype("float32")
    memory = RNG.normal(size=(groups, src_len, 6)).astype("float32")
    mask = np.ones((groups, 1, 1, src_len), bool)
    mask[1, ..., 3:] = False  # the second sentence is shorter
    expected = np.asarray(layer(rows.reshape(groups, size, 6), memory, attention_mask=mask))  # [groups, size, 6]
    key, value = project_key_value(layer, memory)
    cache = {"key": key, "value": value}
    output, returned = attend_with_cache(layer, rows, cache, attention_kernels(layer, self_attention=False), mask, size)
    np.testing.assert_allclose(np.asarray(output), expected.reshape(groups * size, 6), rtol=1e-5, atol=1e-5)
    assert returned is cache  # static: nothing written


@pytest.mark.parametrize("key_dim, value_dim", [(4, 4), (4, 3)])  # keys and values in one tensor, and apart
def test_self_attention_written_step_by_step_equals_the_layers_causal_call(key_dim, value_dim):
    """Hypotheses that never reorder, past the first block of 8: each step equals the causal call at its position."""
    groups, size, length = 2, 2, 11
    layer = attention_layer(key_dim, value_dim)
    x = RNG.normal(size=(groups * size, length, 6)).astype("float32")  # one sequence per hypothesis
    causal = np.tril(np.ones((length, length), bool))[None, None]  # [1, 1, len, len]
    expected = np.asarray(layer(x, x, attention_mask=causal))  # [groups * size, len, 6]
    blocks = (length + caching.CACHE_BLOCK - 1) // caching.CACHE_BLOCK
    slots = caching.CACHE_BLOCK * size
    cache = caching.layer_slots(blocks, groups, 2, slots, key_dim, value_dim, "float32")
    assert set(cache) == ({"key_value"} if key_dim == value_dim else {"key", "value"})
    history = np.zeros((groups * size, blocks * caching.CACHE_BLOCK), "int32")
    kernels = attention_kernels(layer, self_attention=True)
    for step in range(length):
        history = caching.write_history(history, size, step)
        where = caching.prefix_step({"layers": [cache]}, history, step, size)
        output, cache = attend_with_cache(layer, x[:, step], cache, kernels, where.mask, size, where)
        np.testing.assert_allclose(np.asarray(output), expected[:, step], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32"])
def test_transpose_moves_the_same_bits_as_tf_transpose(dtype):
    """The search's transpose (Eigen's, on the bits as integers) moves values exactly; NaN and -0.0 included."""
    values = np.random.default_rng(0).normal(size=(3, 4, 2, 5)).astype("float32")
    values[0, 0, 0, :2] = [np.nan, -0.0]
    x = tf.cast(tf.constant(values), dtype)
    moved = transpose(x, (2, 0, 3, 1))
    assert moved.dtype == x.dtype
    expected = tf.transpose(x, (2, 0, 3, 1))
    bits = tf.int32 if dtype in ("float32", "int32") else tf.int16
    np.testing.assert_array_equal(tf.bitcast(moved, bits).numpy(), tf.bitcast(expected, bits).numpy())


def test_few_row_softmax_is_the_softmax():
    scores = np.random.default_rng(1).normal(scale=4.0, size=(2, 4, 3, 17)).astype("float32")
    scores[0, 0, 0, 3:] = -1e9  # masked keys get zero weight, as under the layer's softmax
    weights = few_row_softmax(tf.constant(scores)).numpy()
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(weights, shifted / shifted.sum(axis=-1, keepdims=True), rtol=2e-6, atol=1e-7)
    assert (weights[0, 0, 0, 3:] == 0).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("groups", [1, 8])  # Eigen's products, and oneDNN's for more than 16 hypotheses
def test_attention_over_memory_and_cache_runs_in_every_float_type(dtype, groups):
    """A mixed_float16 model's dev evaluation and a float16 export decode through these products:
    BatchMatMulV3 has no float16 CPU kernel, so the search must not ask for one."""
    heads, size, depth = 2, 4, 8
    query = tf.cast(RNG.normal(size=(groups, heads, size, depth)), dtype)
    key_t = tf.cast(RNG.normal(size=(groups, heads, depth, 5)), dtype)
    value = tf.cast(RNG.normal(size=(groups, heads, 5, depth)), dtype)
    out = transposed_key_attention(query, key_t, value, None)
    assert out.dtype == query.dtype and out.shape == (groups, heads, size, depth)
    key = tf.cast(RNG.normal(size=(2, groups, heads, 3, depth)), dtype)
    blocked_value = tf.cast(RNG.normal(size=(2, groups, heads, 3, depth)), dtype)
    mask = np.ones((groups, 1, size, 6), bool)
    out = blocked_attention(query, key, blocked_value, tf.constant(mask))
    assert out.dtype == query.dtype and np.isfinite(out.numpy().astype("float32")).all()


def test_memory_keys_and_values_are_float32_under_a_bfloat16_layer():
    """Once per search, the memory's keys and values go to float32: Eigen's float32 product is the faster on CPUs,
    the scores are wanted in float32, and the step's output comes back in the layer's dtype."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype="bfloat16")
    groups, size, src_len = 2, 3, 5
    rows = tf.cast(RNG.normal(size=(groups * size, 6)), "bfloat16")
    memory = tf.cast(RNG.normal(size=(groups, src_len, 6)), "bfloat16")
    layer(tf.reshape(rows, (groups, size, 6)), memory)  # builds the layer
    key, value = project_key_value(layer, memory)
    assert key.dtype == value.dtype == tf.float32
    np.testing.assert_array_equal(  # the values a bfloat16 projection gives, not recomputed in float32
        value.numpy(), tf.cast(layer.split_heads(layer.value_dense(memory), 4), "float32").numpy()
    )
    mask = np.ones((groups, 1, 1, src_len), bool)
    kernels = attention_kernels(layer, self_attention=False)
    output, _ = attend_with_cache(layer, rows, {"key": key, "value": value}, kernels, mask, size)
    assert output.dtype == tf.bfloat16
    expected = layer(tf.reshape(rows, (groups, size, 6)), memory, attention_mask=mask)  # [groups, size, 6]
    np.testing.assert_allclose(
        tf.cast(output, "float32").numpy(), tf.cast(tf.reshape(expected, (-1, 6)), "float32").numpy(), atol=0.05
    )

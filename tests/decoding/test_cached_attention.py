"""Eq. 1 over the decoding cache's blocks and over transposed memory keys."""

import numpy as np

from tests.layers.test_attention import np_attention
from tf_transformer.decoding.cached_attention import blocked_attention, transposed_key_attention

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

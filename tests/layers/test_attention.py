"""Eq. 1 and multi-head attention against a NumPy reference; masking is exact."""

import numpy as np
import pytest

from tests.layers.harness import run_layer_test
from tf_transformer.layers.attention import MultiHeadAttention, ScaledDotProductAttention

RNG = np.random.default_rng(0)


def np_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def np_attention(q, k, v, mask=None):
    """softmax(Q Kᵀ / √d_k) V on [..., len, dim] arrays; mask True = keep."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = np_softmax(scores)
    return weights @ v, weights


def test_scaled_dot_product_matches_numpy():
    q = RNG.normal(size=(2, 3, 5, 8)).astype("float32")
    k = RNG.normal(size=(2, 3, 7, 8)).astype("float32")
    v = RNG.normal(size=(2, 3, 7, 4)).astype("float32")
    mask = np.ones((2, 1, 1, 7), bool)
    mask[1, ..., 5:] = False
    output, weights = ScaledDotProductAttention()(q, k, v, attention_mask=mask)
    expected, expected_weights = np_attention(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(output), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(weights), expected_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_heads,key_dim,value_dim", [(4, 8, 8), (2, 3, 5), (1, 16, 16)])
def test_multi_head_attention_matches_numpy(num_heads, key_dim, value_dim):
    query = RNG.normal(size=(2, 5, 12)).astype("float32")
    memory = RNG.normal(size=(2, 6, 10)).astype("float32")
    mask = np.ones((2, 1, 1, 6), bool)
    mask[0, ..., 4:] = False
    layer = MultiHeadAttention(num_heads, key_dim, value_dim)
    output = np.asarray(layer(query, memory, attention_mask=mask))
    assert output.shape == (2, 5, 12)  # output width defaults to the query's

    def project(dense, x, depth):
        kernel, bias = (w.numpy() for w in dense.weights)
        y = x @ kernel + bias  # [batch, len, heads·depth]
        return y.reshape(y.shape[0], y.shape[1], num_heads, depth).transpose(0, 2, 1, 3)

    q = project(layer.query_dense, query, key_dim)
    k = project(layer.key_dense, memory, key_dim)
    v = project(layer.value_dense, memory, value_dim)
    heads, _ = np_attention(q, k, v, mask)  # [batch, heads, q_len, d_v]
    concat = heads.transpose(0, 2, 1, 3).reshape(2, 5, num_heads * value_dim)
    kernel, bias = (w.numpy() for w in layer.output_dense.weights)
    np.testing.assert_allclose(output, concat @ kernel + bias, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_padded_keys_get_exactly_zero_weight(dtype):
    x = RNG.normal(size=(2, 6, 16)).astype("float32")
    mask = np.ones((2, 1, 1, 6), bool)
    mask[0, ..., 3:] = False
    mask[1, ..., 1:] = False
    layer = MultiHeadAttention(4, 4, dtype=dtype)
    _, weights = layer(x, x, attention_mask=mask, return_attention_scores=True)
    weights = np.asarray(weights).astype("float32")  # [batch, heads, q_len, k_len]
    assert np.all(weights[0, :, :, 3:] == 0.0)
    assert np.all(weights[1, :, :, 1:] == 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-2)


def test_fully_masked_rows_stay_finite_in_float16():
    x = RNG.normal(size=(1, 4, 8)).astype("float32")
    mask = np.zeros((1, 1, 1, 4), bool)
    output = MultiHeadAttention(2, 4, dtype="mixed_float16")(x, x, attention_mask=mask)
    assert np.all(np.isfinite(np.asarray(output).astype("float32")))


def test_scaled_dot_product_layer_contract():
    q = RNG.normal(size=(2, 2, 4, 8)).astype("float32")
    v = RNG.normal(size=(2, 2, 5, 8)).astype("float32")
    run_layer_test(
        ScaledDotProductAttention,
        {"dropout": 0.1},
        (q, v, v),
        expected_output_shape=(2, 2, 4, 8),
        expected_num_weights=0,
    )


def test_multi_head_attention_layer_contract():
    query = RNG.normal(size=(2, 5, 16)).astype("float32")
    memory = RNG.normal(size=(2, 7, 16)).astype("float32")
    mask = np.ones((2, 1, 1, 7), bool)
    run_layer_test(
        MultiHeadAttention,
        {"num_heads": 4, "key_dim": 2, "value_dim": 6, "dropout": 0.0},
        (query, memory),
        {"attention_mask": mask},
        expected_output_shape=(2, 5, 16),
        expected_num_weights=8,  # q, k, v, output: kernel and bias each
    )

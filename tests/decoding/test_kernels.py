"""Decoding kernels: fused and laid out per layer and CPU, the same products as the Dense layers."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.decoding import kernels
from tf_transformer.layers import PositionwiseFeedForward
from tf_transformer.layers.attention import MultiHeadAttention, folded_query_scale, scale_query

RNG = np.random.default_rng(1)


@pytest.mark.parametrize("transpose", [False, True])
def test_decoding_kernels_project_as_the_dense_layers(transpose):
    """Fused decoding kernels, in either layout, give the Dense layers' outputs side by side."""
    x = RNG.normal(size=(6, 8)).astype("float32")
    for use_bias in (False, True):
        denses = [keras.layers.Dense(units, use_bias=use_bias) for units in (3, 5)]
        for dense in denses:
            dense.build((None, 8))
            if use_bias:
                dense.bias.assign(RNG.normal(size=dense.bias.shape).astype("float32"))
        weights = kernels.decoding_kernel(denses, "float32", transpose=transpose)
        assert sorted(weights) == sorted(["kernel_t" if transpose else "kernel"] + (["bias"] if use_bias else []))
        expected = np.concatenate([np.asarray(dense(x)) for dense in denses], axis=-1)  # [6, 8]
        np.testing.assert_allclose(np.asarray(kernels.project(x, weights)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transposed", [False, True])
def test_feed_forward_decodes_rows_as_eq2_in_either_kernel_layout(monkeypatch, transposed):
    """Decoding's FFN equals the layer in both layouts the CPU may pick for its kernels."""
    monkeypatch.setattr(kernels, "feed_forward_transposed", lambda dtype: transposed)
    x = RNG.normal(size=(5, 8)).astype("float32")
    layer = PositionwiseFeedForward(16)
    expected = np.asarray(layer(x))
    weights = kernels.feed_forward_kernels(layer)
    for part in ("inner", "outer"):
        assert ("kernel_t" in weights[part]) == transposed and ("kernel" in weights[part]) != transposed
    np.testing.assert_allclose(np.asarray(kernels.feed_forward_rows(layer, x, weights)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", 3e-2)])
def test_feed_forward_in_the_layout_this_cpu_picks_is_eq2(dtype, tolerance):
    """Whatever layout this machine's CPU picks for ``dtype``, decoding's FFN is eq. 2 computed in NumPy."""
    x = RNG.normal(size=(5, 8)).astype("float32")
    layer = PositionwiseFeedForward(16, dtype=dtype)
    layer.build((None, 8))
    w1, b1 = (np.asarray(v, "float32") for v in (layer.inner.kernel, layer.inner.bias))
    w2, b2 = (np.asarray(v, "float32") for v in (layer.outer.kernel, layer.outer.bias))
    expected = np.maximum(x @ w1 + b1, 0) @ w2 + b2  # FFN(x) = max(0, xW1 + b1)W2 + b2
    rows = np.asarray(kernels.feed_forward_rows(layer, keras.ops.cast(x, dtype), kernels.feed_forward_kernels(layer)))
    np.testing.assert_allclose(rows.astype("float32"), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("key_dim", "scale"), [(4, 0.5), (16, 0.25), (64, 0.125), (8, None), (32, None), (48, None)])
def test_the_query_scale_is_folded_where_it_is_a_power_of_two(key_dim, scale):
    assert folded_query_scale(key_dim) == scale


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("key_dim", [64, 8])
def test_folded_query_projection_gives_the_bits_of_scaling_after_it(dtype, key_dim):
    """Where 1/√d_k is a power of two the search's query columns carry it and give scale_query's bits exactly;
    elsewhere the columns are the layer's own, and the search scales after the product."""
    layer = MultiHeadAttention(num_heads=2, key_dim=key_dim, use_bias=True, dtype=dtype)
    layer.build((None, None, 32), (None, None, 32))
    for weight in layer.weights:
        weight.assign(RNG.normal(size=weight.shape, scale=0.5).astype("float32"))
    rows = tf.cast(RNG.normal(size=(6, 32)), dtype)
    weights = kernels.attention_kernels(layer, self_attention=True)
    query = kernels.project(rows, weights["input"])[:, : 2 * key_dim]  # [6, h·d_k]
    plain = kernels.project(rows, kernels.decoding_kernel([layer.query_dense], dtype, transpose=False))
    if key_dim == 64:
        expected = scale_query(tf.reshape(plain, (6, 2, key_dim)))  # eq. 1's scaling after the product
        np.testing.assert_array_equal(
            tf.cast(query, "float32").numpy(), tf.cast(tf.reshape(expected, (6, -1)), "float32").numpy()
        )
    else:
        np.testing.assert_array_equal(tf.cast(query, "float32").numpy(), tf.cast(plain, "float32").numpy())

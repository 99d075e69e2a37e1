"""Decoding kernels: fused and laid out per layer and CPU, the same products as the Dense layers."""

import keras
import numpy as np
import pytest

from tf_transformer.cpu import cpu_info
from tf_transformer.decoding import kernels
from tf_transformer.layers import PositionwiseFeedForward

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


def test_feed_forward_kernels_untransposed_only_for_float32_with_avx512():
    flags = cpu_info()[1]
    if not flags:
        pytest.skip("no CPU flags in /proc/cpuinfo on this machine")
    assert kernels.feed_forward_transposed("float32") is ("avx512f" not in flags)
    assert kernels.feed_forward_transposed("bfloat16") is True  # slower untransposed on AVX-512 too

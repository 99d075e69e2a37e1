"""Feed-forward, positions, embeddings, encoder and decoder layers and stacks."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.layers.harness import run_layer_test
from tf_transformer.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    LayerNormalization,
    LearnedPositionEmbedding,
    PositionwiseFeedForward,
    SharedEmbedding,
    SinusoidalPositionEncoding,
)

RNG = np.random.default_rng(1)
LAYER = dict(num_heads=4, key_dim=4, value_dim=4, d_ff=32, dropout=0.1)


def test_feed_forward_matches_eq2():
    x = RNG.normal(size=(2, 3, 8)).astype("float32")
    layer = PositionwiseFeedForward(16)
    y = np.asarray(layer(x))
    w1, b1 = (w.numpy() for w in layer.inner.weights)
    w2, b2 = (w.numpy() for w in layer.outer.weights)
    np.testing.assert_allclose(y, np.maximum(0, x @ w1 + b1) @ w2 + b2, rtol=1e-5, atol=1e-5)
    run_layer_test(PositionwiseFeedForward, {"d_ff": 16, "relu_dropout": 0.1}, (x,), expected_num_weights=4)


def test_layer_norm_equals_keras_layer_norm():
    x = tf.constant(RNG.normal(3.0, 2.0, size=(2, 5, 16)).astype("float32"))
    ours, reference = LayerNormalization(epsilon=1e-6), keras.layers.LayerNormalization(epsilon=1e-6)
    ours.build(x.shape)
    reference.build(x.shape)
    weights = [RNG.normal(size=16).astype("float32"), RNG.normal(size=16).astype("float32")]  # γ, β
    ours.set_weights(weights)
    reference.set_weights(weights)
    results = []
    for layer in (ours, reference):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * tf.sin(x))
        results.append([y, *tape.gradient(loss, [x, layer.gamma, layer.beta])])
    for actual, expected in zip(*results, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    keras.config.set_dtype_policy("mixed_bfloat16")
    half = LayerNormalization(epsilon=1e-6)
    half.build(x.shape)
    half.set_weights(ours.get_weights())
    y = half(tf.cast(x, "bfloat16"))
    assert y.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(y, "float32"), results[0][0], atol=0.05)
    keras.config.set_dtype_policy("float32")
    # The last axis named by its index takes the same path; other settings fall back to Keras's computation.
    for kwargs in ({"axis": 2}, {"axis": 1}, {"center": False}, {"scale": False}):
        np.testing.assert_allclose(
            LayerNormalization(**kwargs)(x), keras.layers.LayerNormalization(**kwargs)(x), rtol=1e-5, atol=1e-5
        )
    wide = tf.cast(x, "float64")
    assert LayerNormalization(dtype="float64")(wide).dtype == tf.float64
    run_layer_test(LayerNormalization, {"epsilon": 1e-6}, (x.numpy(),), expected_num_weights=2)


def test_sinusoids_match_section_3_5():
    x = np.zeros((1, 50, 16), "float32")
    pe = np.asarray(SinusoidalPositionEncoding()(x))
    pos = np.arange(50)[:, None]
    i = np.arange(8)[None, :]
    np.testing.assert_allclose(pe[:, 0::2], np.sin(pos / 10000 ** (2 * i / 16)), atol=1e-5)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(pos / 10000 ** (2 * i / 16)), atol=1e-5)
    shifted = np.asarray(SinusoidalPositionEncoding()(x[:, :5], start_index=7))
    np.testing.assert_allclose(shifted, pe[7:12], atol=1e-5)
    run_layer_test(SinusoidalPositionEncoding, {"max_wavelength": 10000.0}, (x,), expected_num_weights=0)


def test_learned_positions():
    x = np.zeros((2, 6, 8), "float32")
    layer, out = run_layer_test(
        LearnedPositionEmbedding,
        {"max_positions": 10},
        (x,),
        expected_output_shape=(6, 8),
        expected_num_weights=1,
        run_fit=False,  # output has no batch axis; trained through the stacks below
    )
    np.testing.assert_allclose(np.asarray(layer(x[:, :2], start_index=3)), layer.weights[0].numpy()[3:5])


def test_shared_embedding_scales_and_projects():
    ids = np.array([[3, 1, 0]])
    layer = SharedEmbedding(10, 4)
    embedded = np.asarray(layer(ids))
    table = layer.weights[0].numpy()
    np.testing.assert_allclose(embedded, table[ids] * math.sqrt(4), rtol=1e-6)
    hidden = RNG.normal(size=(1, 3, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(layer(hidden, reverse=True)), hidden @ table.T, rtol=1e-5, atol=1e-6)
    run_layer_test(SharedEmbedding, {"vocab_size": 10, "d_model": 4}, (ids,), expected_num_weights=1, run_fit=False)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_encoder_layer(pre_norm):
    x = RNG.normal(size=(2, 5, 16)).astype("float32")
    mask = np.ones((2, 1, 1, 5), bool)
    mask[0, ..., 3:] = False
    run_layer_test(
        EncoderLayer,
        {**LAYER, "pre_norm": pre_norm},
        (x,),
        {"attention_mask": mask},
        expected_output_shape=(2, 5, 16),
        expected_num_weights=4 + 4 + 4,  # attention kernels (no biases, as in the paper), FFN, two LayerNorms
    )


@pytest.mark.parametrize("pre_norm", [False, True])
def test_decoder_layer(pre_norm):
    x = RNG.normal(size=(2, 4, 16)).astype("float32")
    memory = RNG.normal(size=(2, 6, 16)).astype("float32")
    self_mask = np.broadcast_to(np.tril(np.ones((4, 4), bool)), (2, 1, 4, 4)).copy()
    memory_mask = np.ones((2, 1, 1, 6), bool)
    run_layer_test(
        DecoderLayer,
        {**LAYER, "pre_norm": pre_norm},
        (x, memory),
        {"self_attention_mask": self_mask, "memory_mask": memory_mask},
        expected_output_shape=(2, 4, 16),
        expected_num_weights=4 + 4 + 4 + 6,  # two attentions (kernels only), FFN, three LayerNorms
    )


@pytest.mark.parametrize("position,pre_norm", [("sinusoidal", False), ("learned", True)])
def test_stacks(position, pre_norm):
    x = RNG.normal(size=(2, 5, 16)).astype("float32")
    y = RNG.normal(size=(2, 3, 16)).astype("float32")
    mask = np.ones((2, 1, 1, 5), bool)
    stack = {**LAYER, "num_layers": 2, "position": position, "max_positions": 8, "pre_norm": pre_norm}
    extra = (1 if position == "learned" else 0) + (2 if pre_norm else 0)
    run_layer_test(
        Encoder,
        stack,
        (x,),
        {"padding_mask": mask},
        expected_output_shape=(2, 5, 16),
        expected_num_weights=2 * 12 + extra,
    )
    run_layer_test(
        Decoder,
        stack,
        (y, x),
        {
            "self_attention_mask": np.broadcast_to(np.tril(np.ones((3, 3), bool)), (2, 1, 3, 3)).copy(),
            "memory_mask": mask,
        },
        expected_output_shape=(2, 3, 16),
        expected_num_weights=2 * 18 + extra,
    )

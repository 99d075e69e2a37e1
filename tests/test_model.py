"""The whole model: architecture size, padding, causality, saving, precision, fit."""

import json
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from configs import get_config
from tf_transformer import Transformer, build_transformer
from tf_transformer.flops import forward_flops

RNG = np.random.default_rng(2)

# Table 3's "params ×10^6" column; the paper's shared vocabulary has ~37,000 tokens.
PAPER_PARAMS_MILLIONS = {
    "base": 65,
    "big": 213,
    "B1": 58,
    "B2": 60,
    "C1": 36,
    "C2": 50,
    "C3": 80,
    "C4": 28,
    "C5": 168,
    "C6": 53,
    "C7": 90,
}


def tiny_model(**overrides):
    return build_transformer(get_config("tiny", **overrides))


def random_ids(batch, length, vocab=256, pad_from=None):
    ids = RNG.integers(4, vocab, size=(batch, length)).astype("int32")
    if pad_from is not None:
        for row, start in enumerate(pad_from):
            ids[row, start:] = 0
    return ids


@pytest.mark.parametrize("name", list(PAPER_PARAMS_MILLIONS))
def test_parameter_count_matches_table3(name):
    model = build_transformer(get_config(name, vocab_size=37000))
    params = model.count_params() / 1e6
    paper = PAPER_PARAMS_MILLIONS[name]
    assert abs(params - paper) / paper <= 0.07, f"{name}: {params:.1f}M vs paper {paper}M"


def test_encoder_and_decoder_depths_build_what_they_say():
    """A 3-layer encoder and 1-layer decoder: the parameters counted by hand from section 3's shapes."""
    config = get_config("tiny", encoder_layers=3, decoder_layers=1)  # d_model 32, d_ff 64, vocab 256
    model = build_transformer(config)
    assert (len(model.encoder.encoder_layers), len(model.decoder.decoder_layers)) == (3, 1)
    d, d_ff = 32, 64
    attention = 4 * d * d  # W^Q, W^K, W^V, W^O, no biases (section 3.2.2)
    norm = 2 * d  # gain and bias
    ffn = d * d_ff + d_ff + d_ff * d + d  # eq. 2's W1, b1, W2, b2
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    assert model.count_params() == 256 * d + 3 * encoder_layer + 1 * decoder_layer
    _, weights = model.attention_weights({"inputs": random_ids(1, 4), "targets": random_ids(1, 3)})
    assert (len(weights["encoder"]), len(weights["decoder"])) == (3, 1)
    assert Transformer.from_config(model.get_config()).config == config
    equal = get_config("tiny", num_layers=3)
    assert forward_flops(config, 8, 20, 20) < forward_flops(equal, 8, 20, 20)  # two decoder layers fewer
    assert get_config("tiny", num_layers=5).encoder_depth == 5  # unset depths follow N
    with pytest.raises(ValueError, match="decoder_layers"):
        get_config("tiny", decoder_layers=0)


def test_untied_embeddings_would_be_far_off():
    shared = build_transformer(get_config("base", vocab_size=37000)).count_params()
    untied = build_transformer(get_config("base", vocab_size=37000, shared_embeddings=False)).count_params()
    assert untied - shared == 37000 * 512  # a separate source table
    assert untied / 1e6 > 65 * 1.07


def test_call_shapes_and_dtype():
    model = tiny_model()
    logits = model({"inputs": random_ids(3, 7), "targets": random_ids(3, 5)})
    assert logits.shape == (3, 5, 256) and logits.dtype == "float32"
    memory, memory_mask = model.encode(random_ids(3, 7))
    assert memory.shape == (3, 7, 32) and memory_mask.shape == (3, 1, 1, 7)


def test_padded_source_positions_do_not_change_outputs():
    model = tiny_model()
    source = random_ids(2, 6, pad_from=[4, 2])
    targets = random_ids(2, 5)
    reference = np.asarray(model({"inputs": source, "targets": targets}))
    # (a) more padding columns: the real positions' logits are unchanged.
    longer = np.concatenate([source, np.zeros((2, 5), "int32")], axis=1)
    np.testing.assert_allclose(np.asarray(model({"inputs": longer, "targets": targets})), reference, atol=1e-5)
    # (b) arbitrary vectors at padded positions of the embedded source (mask unchanged).
    memory_mask = source[:, None, None, :] != 0
    embedded = np.asarray(model.source_embedding(source))
    garbage = embedded.copy()
    garbage[source == 0] = RNG.normal(size=garbage[source == 0].shape) * 100
    memory_a = np.asarray(model.encoder(embedded, padding_mask=memory_mask))
    memory_b = np.asarray(model.encoder(garbage, padding_mask=memory_mask))
    real = source != 0
    np.testing.assert_allclose(memory_a[real], memory_b[real], atol=1e-5)
    # and the decoder, attending over the memory, ignores whatever sits at padded positions
    noisy_memory = memory_b.copy()
    noisy_memory[~real] = 1e3
    logits_a = np.asarray(model.decode(targets, memory_a, memory_mask))
    logits_b = np.asarray(model.decode(targets, noisy_memory, memory_mask))
    np.testing.assert_allclose(logits_a, logits_b, atol=1e-5)


def test_decoder_is_causal():
    model = tiny_model()
    source = random_ids(2, 6)
    targets = random_ids(2, 8)
    reference = np.asarray(model({"inputs": source, "targets": targets}))
    for i in (1, 4, 7):
        changed = targets.copy()
        changed[:, i:] = random_ids(2, 8 - i)
        logits = np.asarray(model({"inputs": source, "targets": changed}))
        np.testing.assert_allclose(logits[:, :i], reference[:, :i], atol=1e-5)
        assert not np.allclose(logits[:, i:], reference[:, i:])


@pytest.mark.parametrize(
    "overrides",
    [{}, {"pre_norm": True, "position": "learned"}, {"shared_embeddings": False, "source_vocab_size": 300}],
)
def test_keras_file_round_trip(tmp_path, overrides):
    model = tiny_model(**overrides)
    assert Transformer.from_config(model.get_config()).get_config() == model.get_config()
    batch = {"inputs": random_ids(2, 6, pad_from=[6, 3]), "targets": random_ids(2, 4)}
    expected = np.asarray(model(batch))
    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert isinstance(reloaded, Transformer)
    assert reloaded.config == model.config
    assert len(reloaded.weights) == len(model.weights)
    np.testing.assert_array_equal(np.asarray(reloaded(batch)), expected)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_forward_is_finite_and_close(policy):
    reference_model = tiny_model()
    mixed = build_transformer(get_config("tiny"), dtype=policy)
    mixed.set_weights(reference_model.get_weights())
    batch = {"inputs": random_ids(2, 9, pad_from=[9, 5]), "targets": random_ids(2, 7)}
    expected = np.asarray(reference_model(batch))
    logits = np.asarray(mixed(batch))
    assert logits.dtype == np.float32
    assert np.all(np.isfinite(logits))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(logits, expected, atol=0.05 * scale)


@pytest.mark.parametrize("jit_compile", [True, False])
def test_one_fit_step_on_tiny(jit_compile):
    model = tiny_model()
    source, targets = random_ids(4, 10, pad_from=[10, 6, 8, 3]), random_ids(4, 9, pad_from=[9, 9, 5, 7])
    labels = np.where(targets > 0, np.roll(targets, -1, axis=1), 0)
    dataset = tf.data.Dataset.from_tensor_slices(({"inputs": source, "targets": targets}, labels)).batch(4)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
        jit_compile=jit_compile,
    )
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(dataset, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    changed = sum(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights, strict=True))
    assert changed == len(before)


def test_model_info_cli():
    script = pathlib.Path(sys.executable).parent / "tft-model-info"
    assert script.exists(), "console entry point not installed: run `make install`"
    result = subprocess.run(
        [str(script), "--config", "tiny", "--vocab_size", "300"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["config"] == "tiny" and info["model"]["vocab_size"] == 300
    assert info["encoder_layers"] == info["decoder_layers"] == 2
    assert info["params"] == tiny_model(vocab_size=300).count_params()
    bad = subprocess.run([str(script), "--config", "huge"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--config" in bad.stderr


@pytest.mark.parametrize("overrides", [{}, {"pre_norm": True}])
def test_attention_weights_are_the_ones_the_model_used(overrides):
    """Every layer's weights: rows sum to 1, masked keys get 0, and they equal eq. 1 recomputed from the layer."""
    model = tiny_model(**overrides)
    source = random_ids(2, 6, pad_from=[6, 3])
    targets = random_ids(2, 5, pad_from=[5, 4])
    ids = {"inputs": source, "targets": targets}
    logits, weights = model.attention_weights(ids)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(model(ids, training=False)), atol=1e-5)
    assert len(weights["encoder"]) == len(weights["decoder"]) == model.config.num_layers
    heads = model.config.num_heads
    for layer in weights["encoder"]:
        w = np.asarray(layer["self_attention"])
        assert w.shape == (2, heads, 6, 6)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert not w[1, :, :, 3:].any()  # padded source keys
    for layer in weights["decoder"]:
        w, cross = np.asarray(layer["self_attention"]), np.asarray(layer["cross_attention"])
        assert w.shape == (2, heads, 5, 5) and cross.shape == (2, heads, 5, 6)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)
        assert not w[:, :, np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]].any()  # no later positions
        assert not w[1, :, :, 4:].any() and not cross[1, :, :, 3:].any()  # padded target and source keys
    # Recomputed for the first encoder layer: softmax(Q Kᵀ / √d_k) over its input, masked at padding.
    embedded = np.asarray(model.source_embedding(source))
    x = embedded + np.asarray(model.encoder.position_layer(embedded))[None]
    layer = model.encoder.encoder_layers[0]
    h = np.asarray(layer.self_attention_residual.norm(x)) if model.config.pre_norm else x
    attention = layer.self_attention
    q = np.asarray(attention.split_heads(attention.query_dense(h), attention.key_dim))
    k = np.asarray(attention.split_heads(attention.key_dense(h), attention.key_dim))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(attention.key_dim)
    scores = np.where((source != 0)[:, None, None, :], scores, -1e9)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(weights["encoder"][0]["self_attention"]), expected, atol=1e-5)

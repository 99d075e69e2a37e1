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


@pytest.mark.parametrize("overrides", [{}, {"pre_norm": True, "position": "learned", "attention_bias": True}])
def test_encoding_only_the_real_tokens_equals_the_padded_encoder(overrides):
    """Inference skips padding in the position-wise work: same memory at real positions, zeros elsewhere."""
    model = build_transformer(get_config("tiny", **overrides))
    source = random_ids(3, 7, pad_from=[5, 2, 7])  # a different length per sentence, the longest last
    padded, mask = model.encode(source, training=False)
    packed, packed_mask = tf.function(model.encode_tokens)(source)
    real = source != 0
    np.testing.assert_array_equal(np.asarray(packed_mask), np.asarray(mask))
    np.testing.assert_allclose(np.asarray(packed)[real], np.asarray(padded)[real], atol=1e-5)
    assert not np.asarray(packed)[~real].any()


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
    [{}, {"pre_norm": True, "position": "learned"}, {"shared_embeddings": False, "src_vocab_size": 300}],
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
    assert info["config"] == "tiny" and info["vocab_size"] == 300
    assert info["params"] == tiny_model(vocab_size=300).count_params()
    bad = subprocess.run([str(script), "--config", "huge"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--config" in bad.stderr


def test_inference_copy_holds_bfloat16_weights_and_matches_mixed_precision():
    """bfloat16 weights give what mixed_bfloat16 computes (its matmuls see the same bfloat16 inputs)."""
    from tf_transformer.model import inference_copy

    model = build_transformer(get_config("tiny"))
    copy = inference_copy(model, "bfloat16")
    mixed = inference_copy(model, "mixed_bfloat16")
    assert {w.dtype for w in copy.weights} == {"bfloat16"}
    assert {w.dtype for w in mixed.weights} == {"float32"}
    ids = {"inputs": np.array([[5, 6, 7, 3]], "int32"), "targets": np.array([[2, 8, 9, 10]], "int32")}
    reference = np.asarray(model(ids, training=False))
    got = np.asarray(copy(ids, training=False))
    assert got.dtype == np.float32  # logits stay float32
    np.testing.assert_allclose(got, np.asarray(mixed(ids, training=False)), atol=0.05)
    np.testing.assert_allclose(got, reference, atol=0.1)

"""Inference copies whose weights are stored in bfloat16."""

import numpy as np

from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.decoding.precision import inference_copy


def test_inference_copy_holds_bfloat16_weights_and_matches_mixed_precision():
    """bfloat16 weights give what mixed_bfloat16 computes (its matmuls see the same bfloat16 inputs)."""
    model = build_transformer(get_config("tiny"))
    copy = inference_copy(model, "bfloat16")
    mixed = inference_copy(model, "mixed_bfloat16")
    norms = {w.path for w in copy.weights if w.path.split("/")[-1] in ("gamma", "beta")}
    assert norms and {w.dtype for w in copy.weights if w.path in norms} == {"float32"}  # the norm computes in float32
    assert {w.dtype for w in copy.weights if w.path not in norms} == {"bfloat16"}
    assert {w.dtype for w in mixed.weights} == {"float32"}
    ids = {"inputs": np.array([[5, 6, 7, 3]], "int32"), "targets": np.array([[2, 8, 9, 10]], "int32")}
    reference = np.asarray(model(ids, training=False))
    got = np.asarray(copy(ids, training=False))
    assert got.dtype == np.float32  # logits stay float32
    np.testing.assert_allclose(got, np.asarray(mixed(ids, training=False)), atol=0.05)
    np.testing.assert_allclose(got, reference, atol=0.1)

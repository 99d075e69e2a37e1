"""The packed encoder: position-wise work on the real tokens only."""

import numpy as np
import pytest
import tensorflow as tf

from configs import get_config
from tests.test_model import random_ids
from tf_transformer import build_transformer
from tf_transformer.decoding.packing import encode_tokens


@pytest.mark.parametrize("overrides", [{}, {"pre_norm": True, "position": "learned", "attention_bias": True}])
def test_encoding_only_the_real_tokens_equals_the_padded_encoder(overrides):
    """Inference skips padding in the position-wise work: same memory at real positions, zeros elsewhere."""
    model = build_transformer(get_config("tiny", **overrides))
    source = random_ids(3, 7, pad_from=[5, 2, 7])  # a different length per sentence, the longest last
    padded, mask = model.encode(source, training=False)
    packed, packed_mask = tf.function(lambda ids: encode_tokens(model, ids))(source)
    real = source != 0
    np.testing.assert_array_equal(np.asarray(packed_mask), np.asarray(mask))
    np.testing.assert_allclose(np.asarray(packed)[real], np.asarray(padded)[real], atol=1e-5)
    assert not np.asarray(packed)[~real].any()

"""Attention maps: the weights the model used, labelled by token, and merged into words as the module states."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.attention_views.maps import attention_maps, merge_pieces, word_index, words_of
from tf_transformer.constants import BOS_ID


@pytest.fixture(scope="module")
def model():
    return build_transformer(get_config("tiny").replace(vocab_size=40, num_layers=2)).build_for_shapes()


def piece(index: int) -> str:
    return {2: "<s>", 3: "</s>"}.get(index, f"\u2581w{index}" if index % 2 else f"p{index}")


def test_maps_hold_the_weights_the_model_used(model):
    source, target = [5, 6, 7, 9, 3], [11, 12, 13, 3]
    maps = attention_maps(model, source, target, piece)
    assert (
        maps.encoder.shape == (2, 4, 5, 5) and maps.decoder.shape == (2, 4, 4, 4) and maps.cross.shape == (2, 4, 4, 5)
    )
    assert maps.source == [piece(i) for i in source] and maps.target == [piece(i) for i in target]
    assert maps.decoder_input == ["<s>", *(piece(i) for i in target[:-1])]
    _, weights = model.attention_weights(
        {"inputs": tf.constant([source]), "targets": tf.constant([[BOS_ID, 11, 12, 13]])}
    )
    for layer in range(2):
        np.testing.assert_allclose(maps.encoder[layer], weights["encoder"][layer]["self_attention"][0], atol=1e-6)
        np.testing.assert_allclose(maps.cross[layer], weights["decoder"][layer]["cross_attention"][0], atol=1e-6)
    for weights_ in (maps.encoder, maps.decoder, maps.cross):
        np.testing.assert_allclose(weights_.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(np.triu(maps.decoder, k=1) == 0)  # a target token never sees decoder inputs to its right


def test_a_one_token_translation_has_its_one_key(model):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # training's TensorBoard images must not print warnings either
        maps = attention_maps(model, [5, 3], [3], piece)  # the translation is EOS alone
    assert maps.decoder.shape == (2, 4, 1, 1) and np.all(maps.decoder == 1.0)


def test_a_special_token_is_a_word_of_its_own():
    assert word_index(["\u2581Ein", "\u2581Hund", "e", "</s>"]).tolist() == [0, 1, 1, 2]
    assert word_index(["<s>", "ab", "\u2581c"]).tolist() == [0, 1, 2]  # "ab" starts a word after <s>
    assert words_of(["\u2581Ein", "\u2581Hund", "e", "</s>"]) == ["Ein", "Hunde", "</s>"]


def test_words_sum_the_keys_and_average_the_queries(model):
    maps = attention_maps(model, [5, 6, 7, 3], [11, 12, 13, 3], piece)  # source words: w5 p6, w7, </s>
    words = maps.words()
    assert words.source == ["w5p6", "w7", "</s>"] and words.target == ["w11p12", "w13", "</s>"]
    assert words.decoder_input == ["<s>", "w11p12", "w13"]
    expected = maps.encoder[:, :, :, [0, 2, 3]].copy()
    expected[:, :, :, 0] += maps.encoder[:, :, :, 1]  # keys: the word's pieces summed
    expected = np.stack([expected[:, :, :2].mean(axis=2), expected[:, :, 2], expected[:, :, 3]], axis=2)  # queries
    np.testing.assert_allclose(words.encoder, expected, atol=1e-6)
    for weights in (words.encoder, words.decoder, words.cross):
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_merged_rows_still_sum_to_one(data):
    pieces = st.lists(st.sampled_from(["\u2581w", "p", "</s>"]), min_size=1, max_size=8)
    keys, queries = data.draw(pieces), data.draw(pieces)
    weights = np.random.default_rng(data.draw(st.integers(0, 2**31))).random([3, len(queries), len(keys)])
    weights /= weights.sum(axis=-1, keepdims=True)
    merged = merge_pieces(weights, keys, queries)
    assert merged.shape == (3, word_index(queries)[-1] + 1, word_index(keys)[-1] + 1)
    np.testing.assert_allclose(merged.sum(axis=-1), 1.0)
    with pytest.raises(ValueError, match="does not match"):
        merge_pieces(weights[:, :, :-1], keys, queries)

"""Word alignments from piece attention: pieces merged into words as stated, argmax per target word."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_transformer.attention_views.alignment import format_alignment, merge_pieces, word_alignment, word_index


def test_word_index_follows_word_starts():
    assert word_index(["▁Ein", "▁Hund", "e", "s", "▁läuft"]).tolist() == [0, 1, 1, 1, 2]
    assert word_index(["ab", "▁c"]).tolist() == [0, 1]  # the first piece starts a word whatever it holds


def test_merge_sums_the_attended_side_and_averages_the_attending_side():
    source = ["▁a", "b", "▁c"]  # words: "ab", "c"
    target = ["▁x", "▁y", "z"]  # words: "x", "yz"
    attention = np.array(
        [
            [0.2, 0.3, 0.5],
            [0.6, 0.3, 0.1],
            [0.0, 0.2, 0.8],
        ]
    )
    merged = merge_pieces(attention, source, target)
    np.testing.assert_allclose(merged, [[0.5, 0.5], [(0.9 + 0.2) / 2, (0.1 + 0.8) / 2]])
    assert word_alignment(attention, source, target) == [(0, 0), (0, 1)]
    assert format_alignment([(0, 0), (2, 1)]) == "0-0 2-1"
    with pytest.raises(ValueError, match="does not match"):
        merge_pieces(attention[:2], source, target)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_rows_still_sum_to_one_and_a_reversal_is_recovered(data):
    pieces = st.lists(st.sampled_from(["▁w", "p", "▁v"]), min_size=1, max_size=8)
    source, target = data.draw(pieces), data.draw(pieces)
    weights = np.random.default_rng(data.draw(st.integers(0, 2**31))).random([len(target), len(source)])
    attention = weights / weights.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(merge_pieces(attention, source, target).sum(axis=1), 1.0)
    words = ["▁w"] * len(source)  # one piece per word: attention that reverses the words aligns j to n-1-j
    reverse = np.eye(len(words))[::-1]
    assert word_alignment(reverse, words, words) == [(len(words) - 1 - j, j) for j in range(len(words))]


def test_hypothesis_attention_is_the_models_teacher_forced_attention():
    import tensorflow as tf

    from configs import get_config
    from tf_transformer import build_transformer
    from tf_transformer.attention_views.alignment import hypothesis_attention

    model = build_transformer(get_config("tiny").replace(vocab_size=50)).build_for_shapes()
    source = tf.constant([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0]])
    target = tf.constant([[9, 10, 3], [11, 3, 0]])
    attention = hypothesis_attention(model, source, target, layer=-1).numpy()  # [batch, tgt_len, src_len]
    assert attention.shape == (2, 3, 5)
    np.testing.assert_allclose(attention.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(attention[0, :, 4] == 0) and np.all(attention[1, :, 2:] == 0)  # padded keys get nothing
    _, weights = model.attention_weights({"inputs": source, "targets": tf.constant([[2, 9, 10], [2, 11, 3]])})
    expected = weights["decoder"][-1]["cross_attention"].numpy().mean(axis=1)
    np.testing.assert_allclose(attention, expected, atol=1e-6)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_the_graph_aligns_as_the_reference(data):
    """graph_word_alignment on a padded batch equals word_alignment row by row (EOS and padding left out)."""
    import tensorflow as tf

    from tf_transformer.attention_views.alignment import graph_word_alignment

    rows = data.draw(st.integers(1, 3))
    sentence = st.lists(st.sampled_from(["▁w", "p", "▁v", "q", "<unk>"]), min_size=1, max_size=6)
    sources, targets = [data.draw(sentence) for _ in range(rows)], [data.draw(sentence) for _ in range(rows)]
    src_len, tgt_len = max(map(len, sources)) + 2, max(map(len, targets)) + 2  # EOS and at least one padding
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    attention = rng.random([rows, tgt_len, src_len]).astype(np.float32)

    def padded(pieces, length):  # ids 4.. for pieces, then EOS (3) and padding (0); pieces "" there
        ids = [list(range(4, 4 + len(p))) + [3] + [0] * (length - len(p) - 1) for p in pieces]
        strings = [p + ["</s>"] + ["<pad>"] * (length - len(p) - 1) for p in pieces]
        return tf.constant(ids, tf.int32), tf.constant(strings)

    (source_ids, source_pieces), (target_ids, target_pieces) = padded(sources, src_len), padded(targets, tgt_len)
    got = graph_word_alignment(attention, source_ids, target_ids, source_pieces, target_pieces).numpy()
    for row in range(rows):
        piece_attention = attention[row, : len(targets[row]), : len(sources[row])]
        expected = format_alignment(word_alignment(piece_attention, sources[row], targets[row]))
        assert got[row].decode() == expected

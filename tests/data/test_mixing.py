"""Corpora mixed by weight: the proportions, the stream entered at any batch, the weights checked."""

import math

import numpy as np
import pytest
import tensorflow as tf

from pipelines import TrainingData, find_split, mix, training_dataset
from pipelines.dataset import CorpusStats
from pipelines.mixing import BLOCK, choices, taken
from tests.corpora import write_corpus

DRAWS = 4000
SIGMAS = 4.0  # a share outside weight ± 4 binomial standard deviations: probability about 6e-5 per corpus


def _bound(share: float, count: int) -> float:
    return SIGMAS * math.sqrt(share * (1 - share) / count)


@pytest.mark.parametrize("weights", [(0.7, 0.3), (5.0, 3.0, 2.0)])
def test_each_corpus_gives_its_weights_share_of_the_batches(weights):
    """Over 4,000 batches each corpus's share is its normalized weight within 4 binomial standard deviations
    (±0.029 for 0.7), and other seeds draw other sequences."""
    drawn = np.array(list(choices(seed=7, weights=weights).take(DRAWS).as_numpy_iterator()))
    shares = np.bincount(drawn, minlength=len(weights)) / DRAWS
    for share, weight in zip(shares, np.array(weights) / sum(weights), strict=True):
        assert abs(share - weight) <= _bound(weight, DRAWS), (shares, weights)
    other = np.array(list(choices(seed=8, weights=weights).take(DRAWS).as_numpy_iterator()))
    assert (drawn != other).any()


def test_the_choices_from_any_batch_and_the_batches_taken_before_it_agree_with_the_whole_sequence():
    weights = (0.6, 0.4)
    whole = np.array(list(choices(3, weights).take(BLOCK + 900).as_numpy_iterator()))
    for start in (0, 1, 999, BLOCK, BLOCK + 17):
        later = np.array(list(choices(3, weights, start).take(800).as_numpy_iterator()))
        np.testing.assert_array_equal(later, whole[start : start + 800])
        assert taken(3, weights, start) == np.bincount(whole[:start], minlength=2).tolist()


def _toy(source: int, batches_per_epoch: int) -> TrainingData:
    """A stream whose batch ``i`` is ``[source, i]``: which corpus and which of its batches."""

    def stream(start):
        return tf.data.Dataset.counter(start).map(lambda i: tf.stack([tf.constant(source, tf.int64), i]))

    stats = CorpusStats(pairs=10, empty=1, too_long=2, kept=7, max_train_length=64, source_tokens=70, target_tokens=80)
    return TrainingData(stream(0), stats, None, batches_per_epoch, stream)


def test_a_mixture_entered_at_any_batch_continues_it_exactly_and_takes_each_corpus_in_order():
    sources = [_toy(0, 30), _toy(1, 10)]
    mixed = mix(sources, [0.75, 0.25], seed=5)
    assert mixed.batches_per_epoch == 40  # one pass over each corpus
    assert mixed.stats.pairs == 20 and mixed.stats.kept == 14 and mixed.stats.max_train_length == 64
    whole = np.array(list(mixed.dataset.take(DRAWS).as_numpy_iterator()))  # [DRAWS, 2]
    for source, weight in ((0, 0.75), (1, 0.25)):
        mine = whole[whole[:, 0] == source, 1]
        np.testing.assert_array_equal(mine, np.arange(len(mine)))  # no batch of a corpus skipped or repeated
        assert abs(len(mine) / DRAWS - weight) <= _bound(weight, DRAWS)
    for start in (37, 3001):
        resumed = np.array(list(mixed.starting_at(start).take(DRAWS - start).as_numpy_iterator()))
        np.testing.assert_array_equal(resumed, whole[start:])


# Real corpora, mixed and resumed batch by batch: 45 s, the fast suite's longest.
@pytest.mark.slow
def test_real_corpora_mixed_resume_batch_for_batch(tokenizer, corpus_dir, tmp_path):
    """Two corpora's token-budget streams mixed: the stream from batch n (a resumed run's) equals the
    whole stream's batches from n, inputs and labels, across the corpora's epoch ends."""
    other = tmp_path / "other"
    write_corpus(other, n=120, seed=4)
    corpora = [find_split(str(directory), "train", "en", "de") for directory in (corpus_dir, other)]
    sources = [
        training_dataset(
            corpus,
            tokenizer,
            tokens_per_batch=256,
            max_train_length=64,
            seed=3,
            deterministic=True,
            repeat=True,
            cache_dir=str(tmp_path / "cache"),
        )
        for corpus in corpora
    ]
    mixed = mix(sources, [0.6, 0.4], seed=3)
    count = 2 * mixed.batches_per_epoch  # past an epoch end of each corpus
    whole = list(mixed.dataset.take(count).as_numpy_iterator())
    start = mixed.batches_per_epoch // 2 + 1
    resumed = list(mixed.starting_at(start).take(count - start).as_numpy_iterator())
    assert len(resumed) == count - start
    for (features, labels), (expected_features, expected_labels) in zip(resumed, whole[start:], strict=True):
        np.testing.assert_array_equal(labels, expected_labels)
        np.testing.assert_array_equal(features["inputs"], expected_features["inputs"])


def test_weights_must_be_positive_and_one_per_corpus():
    sources = [_toy(0, 3), _toy(1, 3)]
    for weights, message in [
        ([0.5], "1 mixture weights for 2 corpora"),
        ([0.5, 0.0], "positive finite"),
        ([0.5, -1.0], "positive finite"),
        ([0.5, float("nan")], "positive finite"),
    ]:
        with pytest.raises(ValueError, match=message):
            mix(sources, weights, seed=1)

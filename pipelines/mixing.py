"""Several corpora's training streams mixed by weight into one (``--data A --data B --data_weights 0.7,0.3``).

Each corpus keeps its own stream of global batches (:func:`pipelines.training_dataset`:
its own epochs, shuffles and length buckets), and each batch of the mixture is
drawn whole from one of them: corpus ``i`` with probability ``weights[i]``,
as fairseq's and OpenNMT-tf's weighted datasets sample. Batches, not
examples: a batch then keeps the token budget and the few padded shapes of
one corpus's buckets, and each corpus's stream stays one a resumed run can
enter at any batch.

Which corpus gives batch ``n`` is a function of the seed and ``n`` alone
(:func:`choices`: uniform draws, stateless, in blocks of :data:`BLOCK`), so
the mixture from batch ``n`` on is each corpus's stream from the number of
batches it gave before ``n`` (:func:`taken`) with the choices from ``n``: a
resumed run reads exactly the batches an uninterrupted one reads, and only
the epochs it resumes in are rebuilt.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from pipelines.dataset import CorpusStats, TrainingData

BLOCK = 4096  # choices drawn per stateless seed
_SALT = 0x6D6978  # "mix": the choices' seeds differ from the corpora's epoch seeds, drawn from the same seed


def normalized(weights) -> np.ndarray:
    """``weights`` as probabilities; each must be a positive, finite number."""
    weights = np.asarray(weights, np.float64)
    if weights.ndim != 1 or len(weights) == 0 or not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ValueError(f"mixture weights must be positive finite numbers, one per corpus; got {weights.tolist()}")
    return weights / weights.sum()


def _block(seed: int, bounds: tf.Tensor):
    """``block → int64[BLOCK]``: the corpus of each batch of the block, from uniform draws and the
    cumulative weights ``bounds``."""

    def draw(block):
        uniform = tf.random.stateless_uniform(
            [BLOCK], seed=tf.stack([tf.constant(seed + _SALT, tf.int64), block]), dtype=tf.float64
        )  # [BLOCK] in [0, 1)
        index = tf.searchsorted(bounds, uniform, side="right", out_type=tf.int64)  # [BLOCK]
        return tf.minimum(index, tf.size(bounds, out_type=tf.int64) - 1)  # a rounded last bound below 1

    return draw


def _bounds(weights) -> tf.Tensor:
    return tf.constant(np.cumsum(normalized(weights)), tf.float64)  # [corpora]


def choices(seed: int, weights, start: int = 0) -> tf.data.Dataset:
    """The corpus (``int64``) of each batch of the mixture, from batch ``start`` on, forever."""
    draw = _block(seed, _bounds(weights))
    first, offset = divmod(start, BLOCK)
    return tf.data.Dataset.counter(first).map(draw).unbatch().skip(offset)


def taken(seed: int, weights, count: int) -> list[int]:
    """How many of the mixture's first ``count`` batches each corpus gave."""
    draw = _block(seed, _bounds(weights))
    corpora = len(weights)
    totals = np.zeros(corpora, np.int64)
    full, rest = divmod(count, BLOCK)
    for block in range(full + (1 if rest else 0)):
        drawn = draw(tf.constant(block, tf.int64)).numpy()
        if block == full:
            drawn = drawn[:rest]
        totals += np.bincount(drawn, minlength=corpora)
    return totals.tolist()


def mix(sources: list[TrainingData], weights, seed: int) -> TrainingData:
    """One :class:`~pipelines.TrainingData` drawing each batch from one of ``sources`` (repeated streams).

    Its ``batches_per_epoch`` is the sum of the sources' (an epoch is as many
    batches as one pass over each, as fairseq counts a multi-corpus epoch),
    whatever the weights; its ``stats`` are their sums.
    """
    if len(weights) != len(sources):
        raise ValueError(f"{len(weights)} mixture weights for {len(sources)} corpora: give one per corpus")
    weights = normalized(weights).tolist()

    def stream(start: int) -> tf.data.Dataset:
        if start < 0:
            raise ValueError(f"start batch {start} is outside the stream")
        streams = [
            source.starting_at(count) for source, count in zip(sources, taken(seed, weights, start), strict=True)
        ]
        mixed = tf.data.Dataset.choose_from_datasets(streams, choices(seed, weights, start))
        return mixed.prefetch(tf.data.AUTOTUNE)

    stats = [source.stats for source in sources]
    total = CorpusStats(
        **{
            field.name: sum(getattr(s, field.name) for s in stats)
            for field in dataclasses.fields(CorpusStats)
            if field.name != "max_train_length"
        },
        max_train_length=stats[0].max_train_length,
    )
    batches = sum(source.batches_per_epoch for source in sources)
    return TrainingData(stream(0), total, sources[0].buckets, batches, stream)

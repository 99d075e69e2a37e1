"""Tokenized examples → the training stream: filtered, sorted, token-budget batches per epoch.

Reads the examples from :mod:`pipelines.token_cache`. Training elements are
``(features, labels)`` with ``features = {"inputs", "targets": BOS + target[:-1]}``
(the decoder input, shifted right) and ``labels = target`` (ending in EOS).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from absl import logging

from pipelines.batching import (
    Buckets,
    bucket_by_length,
    make_buckets,
    merge_partial_batches,
    pad_batches_to_bucket_size,
)
from pipelines.sources import DataError, ParallelText
from pipelines.token_cache import CHUNK_SIZE, cached_chunks
from pipelines.vocab import BOS_ID, Tokenizer

# Examples sorted together by length (the whole corpus up to this size): bigger
# windows give batches of more uniform length (docs/design/training.md).
DEFAULT_SORT_WINDOW = 1_000_000


@dataclasses.dataclass(frozen=True)
class CorpusStats:
    """What the length filter kept and dropped (never silent)."""

    pairs: int
    empty: int
    too_long: int
    kept: int
    max_train_length: int
    source_tokens: int
    target_tokens: int

    def describe(self, name: str) -> str:
        return (
            f"{name}: {self.pairs} pairs; dropped {self.empty} with an empty side and {self.too_long} "
            f"longer than {self.max_train_length} subwords on a side; kept {self.kept} "
            f"({self.source_tokens} source and {self.target_tokens} target tokens)"
        )


def corpus_stats(lengths: np.ndarray, max_train_length: int) -> CorpusStats:
    """Counts for the filter: an empty side is a length of 1 (EOS only)."""
    empty = (lengths <= 1).any(axis=1)
    # Lengths include EOS; the decoder input (BOS + target[:-1]) has the same length.
    too_long = ~empty & (lengths > max_train_length).any(axis=1)
    kept = ~empty & ~too_long
    return CorpusStats(
        pairs=len(lengths),
        empty=int(empty.sum()),
        too_long=int(too_long.sum()),
        kept=int(kept.sum()),
        max_train_length=max_train_length,
        source_tokens=int(lengths[kept, 0].sum()),
        target_tokens=int(lengths[kept, 1].sum()),
    )


def _keep(lengths, max_train_length: int):
    """Pairs to train on: no empty side (EOS only), no side longer than ``max_train_length``."""
    return (
        (lengths[:, 0] > 1)
        & (lengths[:, 1] > 1)
        & (lengths[:, 0] <= max_train_length)
        & (lengths[:, 1] <= max_train_length)
    )


def windows_sorted_by_length(max_train_length: int, chunks_per_window: int, sort: bool = True):
    """Chunks → filtered examples, sorted by length within windows of chunks.

    Sorting runs of shuffled examples by length before length bucketing makes
    every batch hold nearly equal lengths (fairseq and OpenNMT-tf sort for the
    same reason): far less padding than 8-token-wide buckets alone, with the
    same bounded set of padded shapes. The work is vectorized per window; the
    stable sort keeps the (shuffled) order among equal lengths.
    """

    def filter_and_sort(window):
        inputs = window["inputs"].merge_dims(0, 1)  # [window, (src_len)]
        targets = window["targets"].merge_dims(0, 1)  # [window, (tgt_len)]
        lengths = tf.stack([inputs.row_lengths(), targets.row_lengths()], axis=1)  # [window, 2]
        order = tf.where(_keep(lengths, max_train_length))[:, 0]  # [kept]
        if sort:
            # By the longer side (what buckets use), then by target minus source
            # length: rows whose longer side is the source sort apart from rows whose
            # longer side is the target, so each side's padding to its batch maximum is small.
            kept = tf.gather(lengths, order)  # [kept, 2]
            longer = tf.reduce_max(kept, axis=1)  # [kept]
            key = longer * (2 * max_train_length + 1) + (kept[:, 1] - kept[:, 0] + max_train_length)  # [kept]
            order = tf.gather(order, tf.argsort(key, stable=True))  # [kept]
        return {"inputs": tf.gather(inputs, order), "targets": tf.gather(targets, order)}

    def apply(chunks: tf.data.Dataset) -> tf.data.Dataset:
        return (
            chunks.ragged_batch(chunks_per_window)
            .map(filter_and_sort, num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch()
            .map(lambda ex: {key: tf.reshape(value, [-1]) for key, value in ex.items()})  # ragged row → int32[len]
        )

    return apply


def to_features_and_labels(batch):
    """``{"inputs", "targets"}`` padded batch → ``({"inputs", "targets": decoder input}, labels)``.

    The decoder input is the target shifted right with BOS first; labels are the
    target (ending in EOS). Works on a single example or a padded batch: padding
    stays 0 in both, so the shapes (bucket boundaries) are unchanged.
    """
    labels = batch["targets"]  # [..., tgt_len], EOS last, 0 = padding
    bos = tf.fill(tf.concat([tf.shape(labels)[:-1], [1]], 0), tf.constant(BOS_ID, labels.dtype))  # [..., 1]
    shifted = tf.concat([bos, labels[..., :-1]], axis=-1)  # [..., tgt_len], BOS first
    decoder_input = shifted * tf.cast(labels != 0, labels.dtype)  # EOS never fed at padded positions
    return {"inputs": batch["inputs"], "targets": decoder_input}, labels


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """A training pipeline and what went into it.

    ``dataset`` is the stream from its first batch; :meth:`starting_at` gives it
    from any later batch. A repeated stream is a concatenation of independent
    epochs of exactly ``batches_per_epoch`` batches, epoch ``e`` depending only on
    the seed and ``e``, so a resumed run builds only the epoch it resumes in
    (docs/design/training.md#where-a-resumed-run-picks-up-its-data).
    """

    dataset: tf.data.Dataset
    stats: CorpusStats
    buckets: Buckets
    batches_per_epoch: int
    _stream: Callable[[int], tf.data.Dataset] = dataclasses.field(repr=False, compare=False)

    def starting_at(self, batch: int) -> tf.data.Dataset:
        """The stream without its first ``batch`` batches (a global batch index, counted from 0).

        With ``deterministic=True`` it equals ``dataset.skip(batch)`` batch for
        batch, but reads and shuffles only the epoch that ``batch`` falls in.
        """
        return self._stream(batch)


def _epoch_seeds(seed: int, epoch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Two shuffle seeds (chunks, batches) that depend only on ``seed`` and the epoch."""
    seeds = tf.random.stateless_uniform(
        [2], seed=tf.stack([tf.constant(seed, tf.int64), epoch]), minval=None, maxval=None, dtype=tf.int64
    )
    return seeds[0], seeds[1]


def training_dataset(
    corpus: ParallelText,
    tokenizer: Tokenizer,
    tokens_per_batch: int = 25_000,
    max_train_length: int = 256,
    num_replicas: int = 1,
    pad_to_bucket_boundary: bool = False,
    shuffle: bool = True,
    sort_window: int | None = None,
    seed: int | None = None,
    deterministic: bool = False,
    repeat: bool = False,
    cache_dir: str | None = None,
    name: str = "train",
) -> TrainingData:
    """Token-budget batches of ``(features, labels)`` for ``model.fit`` (section 5.1).

    Each epoch is batched on its own: the buckets' partial batches at its end are
    merged (:class:`~pipelines.batching.EpochPlan`), so every epoch has exactly
    ``batches_per_epoch`` batches and holds each kept pair once.

    Args:
      corpus: a validated parallel corpus (see :mod:`pipelines.sources`).
      tokenizer: the shared SentencePiece tokenizer.
      tokens_per_batch: global budget per side (the paper: 25,000), split evenly
        across ``num_replicas``; no batch exceeds it.
      max_train_length: pairs with a side longer than this (EOS included) are dropped,
        and counted in the returned stats and the log.
      pad_to_bucket_boundary: pad lengths to the bucket's multiple of 8 and each
        bucket's last partial batch to the full batch size with all-padding rows,
        so XLA compiles exactly one shape per bucket.
      shuffle: shuffle every epoch differently (chunks, then batches).
      sort_window: examples sorted by length together before bucketing
        (default: 1M or 16 × the largest batch, rounded up to whole cache
        chunks); 0 or 1 disables sorting.
      seed, deterministic: the same seed with ``deterministic=True`` gives the
        same batches in the same order every run (without a seed, one is drawn).
      repeat: epoch after epoch forever (for step-based training and resuming);
        otherwise one epoch, a new one each time the dataset is iterated.
      cache_dir: where tokenized examples are cached between runs.
    """
    chunks, lengths = cached_chunks(corpus, tokenizer, cache_dir)
    stats = corpus_stats(lengths, max_train_length)
    logging.info("%s", stats.describe(name))
    if stats.kept == 0:
        raise DataError(f"No training pairs left in {', '.join(corpus.paths)} after filtering: {stats.describe(name)}")
    buckets = make_buckets(max_train_length, tokens_per_batch, num_replicas)
    plan = buckets.epoch_plan(lengths[_keep(lengths, max_train_length)].max(axis=1))
    batches = plan.batches
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    options = tf.data.Options()
    options.deterministic = deterministic
    window = max(max(buckets.batch_sizes) * 16, DEFAULT_SORT_WINDOW) if sort_window is None else sort_window
    chunks_per_epoch = max(1, -(-len(lengths) // CHUNK_SIZE))
    chunks_per_window = min(max(1, -(-window // CHUNK_SIZE)), chunks_per_epoch)
    # A sorted window emits its batches shortest first: shuffle about one
    # window's worth of batches so training sees no length curriculum.
    mean_longer = float(np.maximum(lengths[:, 0], lengths[:, 1]).mean())
    window_batches = int(min(chunks_per_window * CHUNK_SIZE, stats.kept) * mean_longer / tokens_per_batch) + 1
    batch_buffer = min(max(window_batches, 16), 2048)

    def epoch(index):
        """One epoch's batches: a function of the seed and ``index`` alone."""
        chunk_seed, batch_seed = _epoch_seeds(seed, index)
        dataset = chunks
        if shuffle:
            dataset = dataset.shuffle(chunks_per_epoch, seed=chunk_seed, reshuffle_each_iteration=False)
        # A window never spans two epochs: otherwise a window of a repeated small
        # corpus holds many copies of each pair, sorted next to each other into
        # the same batches.
        dataset = dataset.apply(windows_sorted_by_length(max_train_length, chunks_per_window, sort=window > 1))
        dataset = dataset.apply(bucket_by_length(buckets, pad_to_bucket_boundary))
        dataset = dataset.apply(merge_partial_batches(buckets, plan, pad_to_bucket_boundary))
        if pad_to_bucket_boundary:
            dataset = dataset.apply(pad_batches_to_bucket_size(buckets))
        dataset = dataset.map(to_features_and_labels, num_parallel_calls=tf.data.AUTOTUNE)
        if shuffle:
            dataset = dataset.shuffle(batch_buffer, seed=batch_seed, reshuffle_each_iteration=False)
        return dataset

    def stream(start: int) -> tf.data.Dataset:
        if start < 0 or (not repeat and start >= batches):
            raise ValueError(f"start batch {start} is outside the stream ({batches} batches per epoch)")
        first, offset = divmod(start, batches)
        if repeat:
            # The first epoch alone, so that a (resumed) run starts as soon as one epoch
            # is ready; each later one built in the background while the one before it
            # is consumed, as its start (reading, sorting, filling the shuffle buffers)
            # would otherwise stall training at every epoch boundary.
            later = tf.data.Dataset.counter(first + 1).interleave(epoch, cycle_length=1, num_parallel_calls=1)
            dataset = epoch(tf.constant(first, tf.int64)).skip(offset).concatenate(later)
        else:  # a new epoch each time the dataset is iterated (Keras iterates it once per fit epoch)
            index = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)
            dataset = index.flat_map(epoch).skip(offset)
        if not repeat:  # a known length: Keras then ends an evaluation pass without running into the end of the data
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches - offset))
        return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)

    return TrainingData(stream(0), stats, buckets, batches, stream)

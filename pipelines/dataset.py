"""Parallel text → tokenized examples (cached on disk) → training and evaluation batches.

Example contract: ``{"inputs": int32[src_len], "targets": int32[tgt_len]}``,
both ending in EOS. Training elements are ``(features, labels)`` with
``features = {"inputs", "targets": BOS + target[:-1]}`` (the decoder input,
shifted right) and ``labels = target`` (ending in EOS).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
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
from pipelines.vocab import BOS_ID, EOS_ID, Tokenizer

CACHE_VERSION = 2
CHUNK_SIZE = 1024
_TOKENIZE_BATCH = 1024
_CACHE_SHUFFLE_BUFFER = 1_000_000
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
    max_length: int
    source_tokens: int
    target_tokens: int

    def describe(self, name: str) -> str:
        return (
            f"{name}: {self.pairs} pairs; dropped {self.empty} with an empty side and {self.too_long} "
            f"longer than {self.max_length} subwords on a side; kept {self.kept} "
            f"({self.source_tokens} source and {self.target_tokens} target tokens)"
        )


def tokenize_pairs(pairs: tf.data.Dataset, tokenizer: Tokenizer) -> tf.data.Dataset:
    """``(source, target)`` strings → ``{"inputs", "targets"}`` ids, each ending in EOS.

    Surrounding whitespace is stripped first; an empty side gives just ``[EOS]``.
    """

    def tokenize(source, target):
        def ids(text):
            tokens = tokenizer.tokenize(tf.strings.strip(text))  # [batch, (len)]
            eos = tf.fill([tokens.nrows(), 1], tf.constant(EOS_ID, tf.int32))  # [batch, 1]
            return tf.concat([tokens, eos], axis=1)  # [batch, (len + 1)]

        return {"inputs": ids(source), "targets": ids(target)}

    return (
        pairs.batch(_TOKENIZE_BATCH)
        .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()  # ragged rows → dense int32[len]
    )


def _cache_key(corpus: ParallelText, tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256()
    digest.update(f"v{CACHE_VERSION}|{corpus.fingerprint()}|".encode())
    digest.update(tokenizer.model_proto)
    return digest.hexdigest()[:20]


def chunk_examples(examples: tf.data.Dataset, seed: int = 0) -> tf.data.Dataset:
    """Examples → shuffled chunks of ``CHUNK_SIZE`` ragged rows (the on-disk cache layout).

    The one-time shuffle (seeded) spreads a corpus that is sorted or grouped in
    its files (Tatoeba is sorted by length) evenly over the chunks; epochs then
    reshuffle the chunks. Whole chunks make reading the cache fast.
    """
    return examples.shuffle(_CACHE_SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=False).ragged_batch(CHUNK_SIZE)


def cached_chunks(
    corpus: ParallelText, tokenizer: Tokenizer, cache_dir: str | None
) -> tuple[tf.data.Dataset, np.ndarray]:
    """Tokenized examples in ragged chunks, and the ``[pairs, 2]`` lengths in chunk order.

    With a ``cache_dir`` they are saved there once and later runs read them back
    without tokenizing. The key covers the files' paths, sizes and mtimes and the
    SentencePiece model. A cache is written into a staging directory and renamed
    into place whole, so a failed or killed run never leaves a directory that
    passes for a cache. Runs sharing ``cache_dir`` may build the same cache at
    once: the first renamed into place wins, and the others discard theirs and read it.
    """
    if cache_dir is None:
        chunks = chunk_examples(tokenize_pairs(corpus.dataset(), tokenizer)).cache()
        return chunks, _lengths(chunks)
    path = os.path.join(cache_dir, _cache_key(corpus, tokenizer))
    if not _is_complete(path):
        os.makedirs(cache_dir, exist_ok=True)
        staging = tempfile.mkdtemp(dir=cache_dir, prefix=".staging-")
        try:
            chunk_examples(tokenize_pairs(corpus.dataset(), tokenizer)).save(os.path.join(staging, "chunks"))
            lengths = _lengths(tf.data.Dataset.load(os.path.join(staging, "chunks")))
            np.save(os.path.join(staging, "lengths.npy"), lengths)
            with open(os.path.join(staging, _COMPLETE), "w") as handle:  # written last
                json.dump({"paths": corpus.paths, "fingerprint": corpus.fingerprint()}, handle)
            _publish(staging, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # already gone when it was renamed into place
        logging.info("Cached %d tokenized pairs of %s in %s", len(lengths), corpus.paths, path)
    lengths = np.load(os.path.join(path, "lengths.npy"))
    return tf.data.Dataset.load(os.path.join(path, "chunks")), lengths


_COMPLETE = "source.json"  # the last file a cache gets


def _is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, _COMPLETE))


def _publish(staging: str, path: str) -> None:
    """Renames the finished ``staging`` to ``path`` unless another run has put a whole cache there first."""
    try:
        os.rename(staging, path)  # fails onto a non-empty directory: two runs' files never mix
        return
    except OSError:
        if _is_complete(path):
            logging.info("Another run cached the same pairs in %s first; reading that", path)
            return
    # Not a whole cache (written by hand or by an older version): it goes, ours takes its place.
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.rename(staging, path)
    except OSError:
        if not _is_complete(path):  # not a third run that finished meanwhile
            raise


def _lengths(chunks: tf.data.Dataset) -> np.ndarray:
    pieces = [
        np.stack([chunk["inputs"].row_lengths().numpy(), chunk["targets"].row_lengths().numpy()], axis=1)
        for chunk in chunks
    ]
    return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros((0, 2), np.int32)


def corpus_stats(lengths: np.ndarray, max_length: int) -> CorpusStats:
    """Counts for the filter: an empty side is a length of 1 (EOS only)."""
    empty = (lengths <= 1).any(axis=1)
    # Lengths include EOS; the decoder input (BOS + target[:-1]) has the same length.
    too_long = ~empty & (lengths > max_length).any(axis=1)
    kept = ~empty & ~too_long
    return CorpusStats(
        pairs=len(lengths),
        empty=int(empty.sum()),
        too_long=int(too_long.sum()),
        kept=int(kept.sum()),
        max_length=max_length,
        source_tokens=int(lengths[kept, 0].sum()),
        target_tokens=int(lengths[kept, 1].sum()),
    )


def _keep(lengths, max_length: int):
    """Pairs to train on: no empty side (EOS only), no side longer than ``max_length``."""
    return (lengths[:, 0] > 1) & (lengths[:, 1] > 1) & (lengths[:, 0] <= max_length) & (lengths[:, 1] <= max_length)


def windows_sorted_by_length(max_length: int, chunks_per_window: int, sort: bool = True):
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
        order = tf.where(_keep(lengths, max_length))[:, 0]  # [kept]
        if sort:
            # By the longer side (what buckets use), then by target minus source
            # length: rows whose longer side is the source sort apart from rows whose
            # longer side is the target, so each side's padding to its batch maximum is small.
            kept = tf.gather(lengths, order)  # [kept, 2]
            longer = tf.reduce_max(kept, axis=1)  # [kept]
            key = longer * (2 * max_length + 1) + (kept[:, 1] - kept[:, 0] + max_length)  # [kept]
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
    max_length: int = 256,
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
      max_length: pairs with a side longer than this (EOS included) are dropped,
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
    stats = corpus_stats(lengths, max_length)
    logging.info("%s", stats.describe(name))
    if stats.kept == 0:
        raise DataError(f"No training pairs left in {', '.join(corpus.paths)} after filtering: {stats.describe(name)}")
    buckets = make_buckets(max_length, tokens_per_batch, num_replicas)
    plan = buckets.epoch_plan(lengths[_keep(lengths, max_length)].max(axis=1))
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
        dataset = dataset.apply(windows_sorted_by_length(max_length, chunks_per_window, sort=window > 1))
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


def evaluation_dataset(
    sources: list[str], tokenizer: Tokenizer, tokens_per_batch: int = 8192, max_batch_size: int = 256
) -> tf.data.Dataset:
    """Source sentences batched by length for decoding: ``{"index": int64[b], "inputs": int32[b, len]}``.

    Sentences are sorted by length so batches carry little padding; each batch
    holds at most ``tokens_per_batch`` padded tokens (a longer sentence goes
    alone) and ``max_batch_size`` sentences. Nothing is dropped or truncated:
    feed the per-batch results and indices to :func:`restore_order`.
    """
    stripped = [text.strip() for text in sources]
    tokens = tokenizer.tokenize(tf.constant(stripped, tf.string)) if stripped else None
    rows = [np.append(row, EOS_ID).astype(np.int32) for row in tokens.numpy()] if stripped else []
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    batches: list[list[int]] = []
    for position in np.argsort(lengths, kind="stable"):  # ascending: the newest is the longest
        current = batches[-1] if batches else None
        if (
            current is None
            or len(current) >= max_batch_size
            or (len(current) + 1) * lengths[position] > tokens_per_batch
        ):
            batches.append([int(position)])
        else:
            current.append(int(position))

    def generate():
        for batch in batches:
            inputs = np.zeros((len(batch), int(lengths[batch].max())), np.int32)  # [b, len], 0 = padding
            for row, position in enumerate(batch):
                inputs[row, : lengths[position]] = rows[position]
            yield {"index": np.asarray(batch, np.int64), "inputs": inputs}

    return tf.data.Dataset.from_generator(
        generate,
        output_signature={"index": tf.TensorSpec([None], tf.int64), "inputs": tf.TensorSpec([None, None], tf.int32)},
    )


def restore_order(indices: list[np.ndarray], outputs: list, total: int) -> list:
    """Puts per-batch ``outputs`` back in the original order given each batch's ``indices``."""
    result = [None] * total
    for batch_indices, batch_outputs in zip(indices, outputs, strict=True):
        for index, output in zip(batch_indices, batch_outputs, strict=True):
            result[int(index)] = output
    missing = [i for i, value in enumerate(result) if value is None]
    if missing:
        raise ValueError(f"No output for {len(missing)} input(s), first at index {missing[0]}")
    return result

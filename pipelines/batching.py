"""Token-budget batching by length (section 5.1), as composable ``ds.apply`` transformations.

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens." Padded lengths are multiples of 8; each
bucket's batch size is the per-replica token budget divided by its padded
length, times the number of replicas, so no batch ever exceeds the budget.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import tensorflow as tf

LENGTH_MULTIPLE = 8
BATCH_MULTIPLE = 8


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """How one epoch is batched: the buckets' full batches, then the leftovers merged.

    Bucketing one epoch on its own leaves each bucket's last batch partly filled;
    those leftovers, sorted longest first, are cut into as few batches as the
    token budget allows (a batch takes the size of the bucket of its longest
    row), so a small corpus does not pay one short batch per bucket every epoch.
    Among the cuts into that many batches, the plan takes the one with the least
    padding, each row counted at its batch's bucket length: filling each batch
    to the brim, longest first, packs short rows under long ones.

    Every merged batch holds a multiple of ``Buckets.merge_unit`` rows (8, or
    the replica count if larger, where the budget allows): the cuts fall on
    multiples of it and the last batch is topped up with all-padding rows
    (which carry no loss weight), so 1, 2, 4 or 8 replicas get the same batches
    and each replica an equal share. Keras ``fit`` and ``evaluate`` under
    ``MirroredStrategy`` average the replicas' parts of the first batch they
    read element by element, which fails on unequal parts, and after shuffling
    (or out of a non-deterministic pipeline) any batch may come first.
    """

    full_batches: int  # batches the buckets fill, in the order they fill
    partial_batches: int  # buckets left partly filled at the end of the epoch
    merged_rows: tuple[int, ...]  # real rows of each batch the leftovers make, longest rows first

    @property
    def batches(self) -> int:
        return self.full_batches + len(self.merged_rows)


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Padded lengths (multiples of 8) and the global batch size of each.

    ``padded_lengths[i]`` holds examples whose longer side is in
    ``(padded_lengths[i-1], padded_lengths[i]]``; its batches have at most
    ``batch_sizes[i]`` pairs, so at most ``batch_sizes[i] * padded_lengths[i]``
    tokens per side.
    """

    padded_lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    tokens_per_batch: int
    num_replicas: int

    def epoch_plan(self, lengths) -> EpochPlan:
        """How one pass over examples whose longer sides are ``lengths`` is batched.

        The counts depend only on how many examples fall into each bucket, not on
        their order, so every epoch of a corpus has the same number of batches.
        """
        bucket = np.searchsorted(np.asarray(self.padded_lengths), np.asarray(lengths), side="left")
        counts = np.bincount(bucket, minlength=len(self.padded_lengths))[: len(self.padded_lengths)]
        sizes = np.asarray(self.batch_sizes)
        leftover = counts % sizes
        merged = _cut_leftovers(leftover, sizes, np.asarray(self.padded_lengths), self.merge_unit)
        return EpochPlan(int(np.sum(counts // sizes)), int(np.count_nonzero(leftover)), merged)

    @property
    def merge_unit(self) -> int:
        """Merged batches hold a multiple of this many rows (the last topped up with all-padding rows).

        ``lcm(8, num_replicas)`` where every batch size is a multiple of it (the
        same cut for 1, 2, 4 or 8 replicas), else the replica count.
        """
        for unit in (math.lcm(BATCH_MULTIPLE, self.num_replicas), self.num_replicas):
            if all(size % unit == 0 for size in self.batch_sizes):
                return unit
        return 1

    @property
    def boundaries(self) -> list[int]:
        # bucket_by_sequence_length's buckets are [b_{i-1}, b_i) and it pads to b_i - 1.
        return [length + 1 for length in self.padded_lengths]


def _cut_leftovers(leftover, sizes, padded_lengths, unit: int = 1) -> tuple[int, ...]:
    """Rows of each merged batch: the fewest batches, then the fewest padded tokens.

    The leftover rows, longest first, are cut into consecutive batches, each
    but the last of a multiple of ``unit`` rows (so every cut falls on a
    multiple of ``unit``; the last is topped up to one with all-padding rows,
    counted too); a batch starting with a row of bucket ``t`` holds at
    most ``sizes[t]`` rows (a multiple of ``unit``), padded to
    ``padded_lengths[t]``. In a best cut every batch starts at the first cut
    position at or after the first row of a bucket, or holds as many rows as it
    can: otherwise moving its start ``unit`` rows earlier takes rows of the same
    bucket from the batch before (whose length is at least as long) without
    padding more. So only those starts are tried, from the end.
    """
    buckets = [b for b in range(len(sizes) - 1, -1, -1) if leftover[b]]  # longest first
    counts = [int(leftover[b]) for b in buckets]
    firsts = np.cumsum([0] + counts[:-1]).tolist()  # the position of each bucket's first row
    total = sum(counts)

    def up(position: int) -> int:  # the first cut position at or after ``position``
        return -(-position // unit) * unit

    def bucket_at(position: int) -> int:  # the index (in ``buckets``) of the row at ``position``
        return int(np.searchsorted(firsts, position, side="right")) - 1

    @functools.cache
    def best(end: int) -> tuple[int, int, tuple[int, ...]]:
        """``(batches, padded tokens, rows per batch)`` of the best cut of the first ``end`` rows."""
        if end == 0:
            return 0, 0, ()
        starts = {up(first) for first in firsts} | {up(max(end - int(sizes[b]), 0)) for b in buckets}
        choices = []
        for start in sorted(starts):
            if start >= end:
                break
            bucket = buckets[bucket_at(start)]
            if end - start <= int(sizes[bucket]):
                batches, padded, rows = best(start)
                choices.append(
                    (batches + 1, padded + (up(end) - start) * int(padded_lengths[bucket]), rows + (end - start,))
                )
        return min(choices)

    return best(total)[2]


def make_buckets(max_length: int, tokens_per_batch: int, num_replicas: int = 1) -> Buckets:
    """Buckets for sequences of at most ``max_length`` tokens per side.

    Args:
      max_length: longest sequence (per side, BOS/EOS included).
      tokens_per_batch: the *global* budget per side (25,000 in the paper); each
        replica gets an equal share of every batch.
      num_replicas: batch sizes are multiples of it.
    """
    if tokens_per_batch < num_replicas * max_length:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} cannot hold one sequence of max_length={max_length} "
            f"on each of {num_replicas} replica(s); raise --tokens_per_batch or lower --max_train_length"
        )
    top = -(-max_length // LENGTH_MULTIPLE) * LENGTH_MULTIPLE
    padded = tuple(range(LENGTH_MULTIPLE, top + 1, LENGTH_MULTIPLE))
    # Batch sizes are multiples of lcm(8, replicas) where the budget allows, so
    # 1, 2, 4 or 8 replicas get the very same global batches (and GPUs get
    # multiples of 8); small budgets fall back to multiples of the replica count.
    # The last bucket may be padded past max_length (to the next multiple of 8):
    # its batch size uses the padded length, so the budget still holds.
    multiple = math.lcm(BATCH_MULTIPLE, num_replicas)
    sizes = []
    for length in padded:
        fits = tokens_per_batch // length
        step = multiple if fits >= multiple else num_replicas
        sizes.append(max(num_replicas, fits // step * step))
    return Buckets(padded, tuple(sizes), tokens_per_batch, num_replicas)


def example_length(*element) -> tf.Tensor:
    """The longer side of a ``{"inputs", "targets"}`` example or of a ``(features, labels)`` pair."""
    if len(element) == 2:
        features, labels = element
        return tf.maximum(tf.shape(features["inputs"])[0], tf.shape(labels)[0])
    (example,) = element
    return tf.maximum(tf.shape(example["inputs"])[0], tf.shape(example["targets"])[0])


def bucket_by_length(buckets: Buckets, pad_to_bucket_boundary: bool = False, length_fn=example_length):
    """Groups elements into batches of similar length within the token budget.

    With ``pad_to_bucket_boundary`` every batch is padded to its bucket's
    length (a multiple of 8), so XLA compiles a bounded set of shapes; without
    it, batches are padded only to their longest element (less padding).
    Elements longer than the last bucket are an error upstream (filter first).
    """

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.bucket_by_sequence_length(
            element_length_func=length_fn,
            bucket_boundaries=buckets.boundaries,
            bucket_batch_sizes=list(buckets.batch_sizes) + [buckets.num_replicas],
            pad_to_bucket_boundary=pad_to_bucket_boundary,
            padding_values=None,  # 0 = padding id
        )

    return apply


def pad_batches_to_bucket_size(buckets: Buckets):
    """Pads a bucket's last, partial batch with all-padding rows up to the bucket's batch size.

    Used with ``pad_to_bucket_boundary`` so that XLA sees exactly one shape per
    bucket and no example is dropped: all-padding rows carry no loss weight.
    Works on ``{"inputs", "targets"}`` batches padded to a bucket length.
    """
    sizes = tf.constant(buckets.batch_sizes, tf.int32)  # [num_buckets]

    def pad(batch):
        length = tf.maximum(tf.shape(batch["inputs"])[1], tf.shape(batch["targets"])[1])
        bucket = tf.minimum(length // LENGTH_MULTIPLE - 1, len(buckets.batch_sizes) - 1)
        missing = tf.maximum(sizes[bucket] - tf.shape(batch["inputs"])[0], 0)
        return {key: tf.pad(value, [[0, missing], [0, 0]]) for key, value in batch.items()}  # [bucket batch, len]

    return lambda dataset: dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)


def merge_partial_batches(buckets: Buckets, plan: EpochPlan, pad_to_bucket_boundary: bool = False):
    """Merges the partial batches that bucketing one epoch leaves at its end, as ``plan`` says.

    Applies to one epoch of :func:`bucket_by_length` batches of ``{"inputs",
    "targets"}``: its first ``plan.full_batches`` pass unchanged; the partial ones
    that follow (one per bucket with leftovers) are gathered, their rows sorted
    longest first and cut into ``plan.merged_rows``. Each merged batch is padded
    to its longest row, or with ``pad_to_bucket_boundary`` to that row's bucket
    length, and with all-padding rows to a multiple of ``buckets.merge_unit``
    rows; it holds at most that bucket's batch size, so the budget holds.
    """
    full = plan.full_batches
    unit = buckets.merge_unit
    ends = np.cumsum(plan.merged_rows, dtype=np.int64)
    bounds = np.stack([ends - np.asarray(plan.merged_rows, np.int64), ends], axis=1)  # [merged, 2]

    def split(group, merged):
        """``[k, rows, len]`` batches → their real rows in the batches the plan gives."""
        rows = {key: tf.reshape(value, [-1, tf.shape(value)[2]]) for key, value in group.items()}  # [k * rows, len]
        real = tf.reduce_any(rows["targets"] > 0, axis=1)  # padded_batch added all-padding rows
        rows = {key: tf.boolean_mask(value, real) for key, value in rows.items()}  # [n, len]
        sides = {key: tf.math.count_nonzero(value > 0, axis=1, dtype=tf.int32) for key, value in rows.items()}  # [n]
        longer = tf.maximum(sides["inputs"], sides["targets"])  # [n]
        n = tf.shape(longer, out_type=tf.int64)[0]
        order = tf.cond(merged, lambda: tf.argsort(-longer, stable=True), lambda: tf.range(tf.size(longer)))  # [n]
        rows = {key: tf.gather(value, order) for key, value in rows.items()}
        sides = {key: tf.gather(value, order) for key, value in sides.items()}
        longer_sorted = tf.gather(longer, order)  # [n]
        spans = tf.cond(merged, lambda: tf.constant(bounds.reshape(-1, 2)), lambda: tf.stack([[0, n]]))  # [batches, 2]

        def take(span):
            missing = tf.cast(-(span[1] - span[0]) % unit, tf.int32)  # all-padding rows to a multiple of ``unit``
            part = {
                key: tf.pad(value[span[0] : span[1]], [[0, missing], [0, 0]]) for key, value in rows.items()
            }  # [batch, len]
            if pad_to_bucket_boundary:  # both sides to the bucket of the longest row
                longest = tf.reduce_max(longer_sorted[span[0] : span[1]])
                width = -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE
                return {key: value[:, :width] for key, value in part.items()}  # [batch, bucket length]
            return {key: value[:, : tf.reduce_max(sides[key][span[0] : span[1]])] for key, value in part.items()}

        return tf.data.Dataset.from_tensor_slices(spans).map(take)

    def key(index, batch):  # the partial batches, which come last, share one key
        return tf.minimum(index, full)

    def window_size(key):
        return tf.where(key < full, tf.constant(1, tf.int64), max(plan.partial_batches, 1))

    def reduce(key, window):
        group = window.map(lambda index, batch: batch).padded_batch(window_size(key))  # [k, rows, len]
        return group.flat_map(lambda batches: split(batches, key >= full))

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.enumerate().group_by_window(key, reduce, window_size_func=window_size)

    return apply

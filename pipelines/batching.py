"""Token-budget batching by length (section 5.1), as composable ``ds.apply`` transformations.

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens." Padded lengths are multiples of 8; each
bucket's batch size is the per-replica token budget divided by its padded
length, times the number of replicas, so no batch ever exceeds the budget.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

LENGTH_MULTIPLE = 8
BATCH_MULTIPLE = 8


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

    def batches_for(self, lengths) -> int:
        """Batches one pass over examples whose longer sides are ``lengths`` makes."""
        import numpy as np

        bucket = np.searchsorted(np.asarray(self.padded_lengths), np.asarray(lengths), side="left")
        counts = np.bincount(bucket, minlength=len(self.padded_lengths))[: len(self.padded_lengths)]
        sizes = np.asarray(self.batch_sizes)
        return int(np.sum(-(-counts // sizes)))

    @property
    def boundaries(self) -> list[int]:
        # bucket_by_sequence_length's buckets are [b_{i-1}, b_i) and it pads to b_i - 1.
        return [length + 1 for length in self.padded_lengths]


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
            f"on each of {num_replicas} replica(s); raise --tokens or lower the max length"
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

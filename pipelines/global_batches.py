"""One global batch, whatever the layout: its token weights and its share for each replica.

Section 5.1 defines a training batch by its tokens ("approximately 25000 source
tokens and 25000 target tokens"), and one update is the gradient of the mean
loss over the target tokens of that batch. The hardware decides how a batch is
cut: into replicas (8 GPUs a machine), into machines, into micro-batches
accumulated on one device. The update must not depend on the cut, so:

* every training element carries ``weights``, one per row, all equal to
  ``1 / T`` with ``T`` the target tokens of the whole update (the ``A``
  consecutive micro-batches of one update with ``--accumulate_steps A``). The
  loss sums ``weight × token loss`` (:mod:`tf_transformer.training.losses`), so
  replicas and micro-batches with few tokens weigh what their tokens weigh, as
  fairseq does by dividing by the sample size, rather than one replica's mean
  counting as much as another's;
* a worker of ``M`` replicas gets ``M`` consecutive parts of each global batch
  (``distribute_datasets_from_function`` dequeues one element per replica), so
  the replicas of all workers together hold each row of one global batch once.
"""

from __future__ import annotations

import tensorflow as tf


def _target_tokens(labels) -> tf.Tensor:
    return tf.reduce_sum(tf.cast(tf.not_equal(labels, 0), tf.float32))


def update_weights(accumulate_steps: int = 1):
    """``(features, labels)`` → ``(features, labels, weights)``, ``weights`` ``[rows]`` of ``1 / T``.

    ``T`` counts the target tokens of the ``accumulate_steps`` consecutive
    batches of one update. Apply it to a stream that starts at an update
    boundary (a resumed run resumes at one), so the groups are those of an
    uninterrupted run.
    """

    def weigh(total):
        def attach(features, labels):
            rows = tf.shape(labels)[0:1]
            return features, labels, tf.fill(rows, 1.0 / tf.maximum(total, 1.0))  # [rows]

        return attach

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if accumulate_steps == 1:
            return dataset.map(lambda f, lab: weigh(_target_tokens(lab))(f, lab), num_parallel_calls=tf.data.AUTOTUNE)

        def group(index, features, labels):
            return index // accumulate_steps

        def reduce(key, window):
            window = window.map(lambda index, features, labels: (features, labels))
            total = window.reduce(tf.constant(0.0), lambda count, element: count + _target_tokens(element[1]))
            return window.map(weigh(total))

        return (
            dataset.enumerate()
            .map(lambda index, element: (index, *element))
            .group_by_window(group, reduce, window_size=accumulate_steps)
        )

    return apply


def part_bounds(rows: tf.Tensor, parts: int) -> tf.Tensor:
    """``[parts, 2]`` row ranges cutting ``rows`` into ``parts`` contiguous parts, sizes differing by ≤ 1.

    A batch of fewer rows than parts leaves some parts empty: their loss and
    gradient are zero, and the weights still make the update the whole batch's.
    """
    edges = tf.cast(tf.range(parts + 1, dtype=tf.int64) * tf.cast(rows, tf.int64) // parts, tf.int32)  # [parts + 1]
    return tf.stack([edges[:-1], edges[1:]], axis=1)


def replica_parts(pipeline_id: int, num_pipelines: int, replicas_in_sync: int):
    """Global batches → this input pipeline's parts of each, one element per local replica.

    The replicas in sync are numbered across pipelines (workers); pipeline
    ``p`` of ``P`` feeds replicas ``p·M … p·M + M − 1`` with ``M =
    replicas_in_sync / P``, so it emits parts ``p·M`` to ``p·M + M − 1`` of each
    global batch, in that order: the ``M`` elements a worker dequeues for one
    step are its share of one global batch.
    """
    if replicas_in_sync % num_pipelines:
        raise ValueError(f"{replicas_in_sync} replicas cannot be shared evenly by {num_pipelines} input pipelines")
    local = replicas_in_sync // num_pipelines
    first = pipeline_id * local

    def parts(*element):
        bounds = part_bounds(tf.shape(element[1])[0], replicas_in_sync)[first : first + local]  # [local, 2]

        def take(span):
            return tf.nest.map_structure(lambda tensor: tensor[span[0] : span[1]], element)

        return tf.data.Dataset.from_tensor_slices(bounds).map(take)

    return lambda dataset: dataset.flat_map(parts)

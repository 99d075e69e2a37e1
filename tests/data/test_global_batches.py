"""Each replica of each worker gets its part of one global batch: every row once, per step."""

import numpy as np
import pytest
import tensorflow as tf

import pipelines
from tf_transformer.training.multi_worker import replica_dataset_fn

ROWS = (16, 8, 3, 11, 1, 24)  # fewer rows than replicas too: some parts are empty


def global_batches():
    """Rows numbered across the stream (``inputs[:, 0]``), so a row's identity survives any cut."""
    batches, first = [], 0
    for rows in ROWS:
        ids = np.arange(first, first + rows, dtype=np.int32)[:, None] * np.ones((1, 5), np.int32)
        labels = ids + 1
        weights = np.full([rows], 1.0 / np.count_nonzero(labels), np.float32)
        batches.append(({"inputs": ids, "targets": ids}, labels, weights))
        first += rows
    spec = (
        {"inputs": tf.TensorSpec([None, 5], tf.int32), "targets": tf.TensorSpec([None, 5], tf.int32)},
        tf.TensorSpec([None, 5], tf.int32),
        tf.TensorSpec([None], tf.float32),
    )
    return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec)


@pytest.mark.parametrize("pipelines_count, replicas_per_worker", [(2, 4), (8, 2), (1, 1), (4, 1)])
def test_the_replicas_of_a_step_hold_one_global_batch(pipelines_count, replicas_per_worker):
    replicas = pipelines_count * replicas_per_worker
    dataset_fn = replica_dataset_fn(global_batches())
    streams = []
    for pipeline in range(pipelines_count):
        context = tf.distribute.InputContext(pipelines_count, pipeline, replicas)
        streams.append(list(dataset_fn(context)))
    for stream in streams:  # each worker dequeues one element per replica and step
        assert len(stream) == replicas_per_worker * len(ROWS)
    first = 0
    for step, rows in enumerate(ROWS):
        parts = [
            stream[step * replicas_per_worker + local] for stream in streams for local in range(replicas_per_worker)
        ]
        seen = np.concatenate([features["inputs"][:, 0].numpy() for features, _, _ in parts])
        np.testing.assert_array_equal(seen, np.arange(first, first + rows))  # each row once, in order
        sizes = [labels.shape[0] for _, labels, _ in parts]
        assert max(sizes) - min(sizes) <= 1
        for features, labels, weights in parts:
            np.testing.assert_array_equal(labels.numpy(), features["inputs"].numpy() + 1)
            assert weights.shape == (labels.shape[0],)
        # The weights still sum, over every token of the step, to one: the update of the whole batch.
        total = sum(float(tf.reduce_sum(w[:, None] * tf.cast(lab > 0, tf.float32))) for _, lab, w in parts)
        assert total == pytest.approx(1.0, rel=1e-6)
        first += rows


def test_an_uneven_split_of_replicas_is_refused():
    with pytest.raises(ValueError, match="3 input pipelines"):
        pipelines.replica_parts(0, 3, 8)

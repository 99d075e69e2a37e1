"""One update per global batch, however it is cut: replicas under ``fit`` and accumulated micro-batches.

The rows of each batch hold very different token counts, so a loss averaged per
replica or per micro-batch (rather than over the batch's tokens) moves the
weights elsewhere; Adam's scale invariance would hide a mere constant factor.
"""

import random

import numpy as np
import pytest
import tensorflow as tf

import pipelines
from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.training.trainer import compile_model

CONFIG = get_config("tiny", vocab_size=64, dropout=0.0)
RNG = np.random.default_rng(7)


def global_batch(rows=8, length=12):
    """Long rows first, short rows last: the halves (replicas, micro-batches) differ 6:1 in tokens."""
    lengths = [length] * (rows // 2) + [2] * (rows - rows // 2)
    ids = np.zeros((rows, length), np.int32)
    for row, size in enumerate(lengths):
        ids[row, :size] = RNG.integers(4, 64, size=size)
    labels = ids.copy()
    decoder = np.concatenate([np.ones((rows, 1), np.int32), ids[:, :-1]], axis=1) * (ids != 0)
    return {"inputs": ids, "targets": decoder}, labels


BATCHES = [global_batch() for _ in range(3)]


def stream(split=1):
    """The global batches (each cut into ``split`` consecutive micro-batches), with the update weights."""

    def pieces():
        for features, labels in BATCHES:
            for part in np.array_split(np.arange(labels.shape[0]), split):
                yield {k: v[part] for k, v in features.items()}, labels[part]

    spec = ({"inputs": tf.TensorSpec([None, None], tf.int32), "targets": tf.TensorSpec([None, None], tf.int32)},)
    spec += (tf.TensorSpec([None, None], tf.int32),)
    return tf.data.Dataset.from_generator(pieces, output_signature=spec).apply(pipelines.update_weights(split))


@pytest.fixture(scope="module")
def initial_weights():
    """The same initial weights whichever tests ran before in this process: Keras's unseeded initializers draw
    their seeds from Python's ``random`` (see tests/training/test_multi_worker_step.py)."""
    state = random.getstate()
    random.seed(5)
    try:
        return build_transformer(CONFIG).get_weights()
    finally:
        random.setstate(state)


def trained(initial_weights, strategy, accumulate=1):
    with strategy.scope():
        model = build_transformer(CONFIG)
        model.set_weights(initial_weights)
        compile_model(model, CONFIG, accumulate_steps=accumulate)
    steps = len(BATCHES) * accumulate
    history = model.fit(stream(accumulate), epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    optimizer = model.optimizer
    updates = int(optimizer.iterations.numpy())
    # Adam's first moment, bias-corrected: the updates' gradients, averaged with its weights.
    gradients = [
        np.asarray(optimizer._momentums[optimizer._get_variable_index(v)].numpy()) / (1 - optimizer.beta_1**updates)
        for v in model.trainable_variables
    ]
    assert len(gradients) == len(model.weights)  # every weight trains: get_weights() and gradients pair up
    return model.get_weights(), history.history["loss"][0], updates, gradients


@pytest.mark.slow
def test_replicas_and_micro_batches_make_the_update_of_the_whole_batch(initial_weights):
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (set in conftest before TensorFlow starts)")
    one, one_loss, updates, gradients = trained(initial_weights, tf.distribute.OneDeviceStrategy("/cpu:0"))
    mirrored = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    replicas, replicas_loss, _, _ = trained(initial_weights, mirrored)
    accumulated, _, accumulated_updates, _ = trained(
        initial_weights, tf.distribute.OneDeviceStrategy("/cpu:0"), accumulate=2
    )
    both, _, both_updates, _ = trained(initial_weights, mirrored, accumulate=2)  # Keras's own accumulation fails here
    assert updates == accumulated_updates == both_updates == len(BATCHES)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(one, initial_weights, strict=True))
    assert moved > 1e-3  # the updates are large enough for a different mean to show
    # Adam moves a weight by lr·m / (√v + 7e-9): where the gradients are within a few hundred times 7e-9 of
    # zero, float32 round-off between layouts (~1e-9) moves it by up to 2·lr whatever the tolerance (a weight
    # of 2,048 off by 8.5e-6 once, by the tests that ran before in the process). Those few are left out.
    steady = [np.abs(g) >= 1e-6 for g in gradients]
    assert sum(int(s.sum()) for s in steady) > 0.98 * sum(s.size for s in steady)
    for a, b, c, d, s in zip(one, replicas, accumulated, both, steady, strict=True):
        np.testing.assert_allclose(b[s], a[s], atol=2e-6, rtol=1e-5)
        np.testing.assert_allclose(c[s], a[s], atol=2e-6, rtol=1e-5)
        np.testing.assert_allclose(d[s], a[s], atol=2e-6, rtol=1e-5)
    # The loss Keras reports is the batch's token mean in both layouts (not the replica count times it).
    assert replicas_loss == pytest.approx(one_loss, rel=1e-5)


def test_update_weights_are_one_over_the_tokens_of_each_update():
    batches = list(stream(2))
    assert len(batches) == 2 * len(BATCHES)
    for first, second in zip(batches[::2], batches[1::2], strict=True):
        tokens = sum(float(np.count_nonzero(labels)) for _, labels, _ in (first, second))
        for _, labels, weights in (first, second):
            assert weights.shape == (labels.shape[0],)
            np.testing.assert_allclose(weights.numpy(), 1.0 / tokens, rtol=1e-6)

"""The global update (``training/update.py``) on 2 logical CPU devices: one overflow verdict, whole groups.

Gradients are given by hand, per replica and micro-batch, to the optimizer
``compile_model`` makes, under a ``tf.function`` as ``fit`` runs it. A
micro-batch's gradient is ``accumulate × w × D_k``: ``w`` is its share of the
update's token weights (the weights of a group sum to 1) and ``D_k`` a random
direction per group, so an update made of the right micro-batches moves by
exactly ``D_k``; one that straddles two groups mixes directions and weights.
The expected weights replay those ``D_k`` through a plain one-device optimizer.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.training.recipe import compile_model
from tf_transformer.training.schedules import paper_optimizer

CONFIG = get_config("tiny", vocab_size=64, dropout=0.0)


def mirrored():
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (set in conftest before TensorFlow starts)")
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())


def compiled(strategy, precision, accumulate, initial=None):
    keras.config.set_dtype_policy(precision)
    with strategy.scope():
        model = build_transformer(CONFIG)
        if initial is not None:
            model.set_weights(initial)
        compile_model(model, CONFIG, accumulate_steps=accumulate)
        model.optimizer.build(model.trainable_variables)
    keras.config.set_dtype_policy("float32")
    return model


def directions(model, count, seed=3):
    rng = np.random.default_rng(seed)
    return [[rng.normal(0, 1e-2, v.shape).astype(np.float32) for v in model.trainable_variables] for _ in range(count)]


def run_micro_batches(model, strategy, parts):
    """``parts[i][r]``: replica ``r``'s gradients (unscaled) for micro-batch ``i``; each scaled by the current scale."""
    optimizer = model.optimizer
    variables = model.trainable_variables

    @tf.function
    def step(per_replica):
        def replica(gradients):
            scale = optimizer.scale_loss(tf.constant(1.0))
            optimizer.apply([g * scale for g in gradients], variables)

        strategy.run(replica, args=(per_replica,))

    for replicas in parts:
        values = strategy.experimental_distribute_values_from_function(
            lambda context, replicas=replicas: [tf.constant(g) for g in replicas[context.replica_id_in_sync_group]]
        )
        step(values)


def every_copy(variable):
    """Each replica's copy of a (Keras) variable."""
    variable = variable.value if isinstance(variable, keras.Variable) else variable
    return [np.array(v) for v in variable.values] if hasattr(variable, "values") else [np.array(variable)]


def replayed(initial, updates):
    """The weights after applying each of ``updates`` (mean gradients) once with a plain one-device optimizer."""
    model = build_transformer(CONFIG)
    model.set_weights(initial)
    optimizer = paper_optimizer(CONFIG.d_model, CONFIG.warmup_steps, CONFIG.learning_rate_scale)
    optimizer.build(model.trainable_variables)
    for update in updates:
        optimizer.apply([tf.constant(g) for g in update], model.trainable_variables)
    return [np.array(v) for v in model.trainable_variables]


@pytest.mark.slow
def test_an_overflow_on_one_replica_skips_the_update_on_every_replica():
    strategy = mirrored()
    model = compiled(strategy, "mixed_float16", accumulate=1)
    initial = [np.array(v) for v in model.trainable_variables]
    good, other = directions(model, 2)
    overflow = [g.copy() for g in good]
    overflow[0][0] = np.inf  # replica 1 only; replica 0's own gradients are finite
    scale = float(model.optimizer.dynamic_scale.numpy())

    run_micro_batches(model, strategy, [[good, overflow]])
    for variable, start in zip(model.trainable_variables, initial, strict=True):
        for copy in every_copy(variable):
            np.testing.assert_array_equal(copy, start)  # no NaN reached Adam, on either replica
    assert [float(c) for c in every_copy(model.optimizer.dynamic_scale)] == [scale / 2, scale / 2]
    assert int(model.optimizer.iterations.numpy()) == 0

    run_micro_batches(model, strategy, [[good, other]])
    expected = replayed(initial, [[a + b for a, b in zip(good, other, strict=True)]])
    assert int(model.optimizer.iterations.numpy()) == 1
    for variable, want in zip(model.trainable_variables, expected, strict=True):
        for copy in every_copy(variable):
            np.testing.assert_allclose(copy, want, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one_device", "mirrored"])
def test_every_applied_update_is_one_global_batch_and_an_overflow_drops_its_whole_group(layout):
    strategy = mirrored() if layout == "mirrored" else tf.distribute.OneDeviceStrategy("/cpu:0")
    replicas = strategy.num_replicas_in_sync
    model = compiled(strategy, "mixed_float16", accumulate=2)
    initial = [np.array(v) for v in model.trainable_variables]
    groups = directions(model, 3)
    shares = [(0.3, 0.7), (0.8, 0.2), (0.45, 0.55)]  # each group's token weights sum to 1

    parts = []
    for group, (direction, weights) in enumerate(zip(groups, shares, strict=True)):
        for micro, weight in enumerate(weights):
            gradient = [2 * weight * d for d in direction]  # the loss is × accumulate_steps
            split = [[g * (0.25 if r == 0 else 0.75) for g in gradient] for r in range(replicas)]
            if replicas == 1:
                split = [gradient]
            if group == 0 and micro == 1:  # the group's second micro-batch overflows (on the last replica)
                split[-1] = [g.copy() for g in split[-1]]
                split[-1][1][...] = np.inf
            parts.append(split)

    run_micro_batches(model, strategy, parts[:3])  # mid-group: every replica's accumulator holds the replicas' sum
    scale = float(model.optimizer.dynamic_scale.numpy())
    summed = [sum(replica[i] for replica in parts[2]) for i in range(len(initial))]
    for accumulator, want in zip(model.optimizer.inner_optimizer._accumulated_gradients, summed, strict=True):
        copies = every_copy(accumulator)
        assert len(copies) == replicas  # a checkpoint keeps the first; all are the same
        for copy in copies:
            np.testing.assert_allclose(copy / scale, want, rtol=1e-6, atol=1e-9)
    run_micro_batches(model, strategy, parts[3:])

    assert int(model.optimizer.iterations.numpy()) == 2  # groups 1 and 2; group 0 was dropped whole
    assert int(model.optimizer.inner_optimizer._iterations.numpy()) == 4
    expected = replayed(initial, groups[1:])  # each applied update moved by exactly its group's direction
    for variable, want in zip(model.trainable_variables, expected, strict=True):
        for copy in every_copy(variable):
            np.testing.assert_allclose(copy, want, rtol=1e-5, atol=1e-7)

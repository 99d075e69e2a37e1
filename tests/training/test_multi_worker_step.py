"""The multi-worker loop's train step, in-process: XLA compiles the replica's step, not the iterator.

``--jit_compile`` under ``--strategy multi_worker`` is refused on CPU workers
(tests/training/test_distributed_options.py), and workers need processes; a
one-device strategy runs the same step function here, and XLA on one CPU device
works, so the step's structure is tested directly.
"""

import random

import numpy as np
import tensorflow as tf

import pipelines
from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.training.multi_worker import _train_step
from tf_transformer.training.trainer import compile_model

CONFIG = get_config("tiny", vocab_size=64, num_layers=1, dropout=0.0)


def batches():
    rng = np.random.default_rng(3)
    ids = rng.integers(4, 64, size=(8, 12)).astype(np.int32)
    ids[4:, 5:] = 0  # rows of different lengths: padding the loss must leave out
    decoder = np.concatenate([np.ones((8, 1), np.int32), ids[:, :-1]], axis=1) * (ids != 0)
    batch = ({"inputs": ids, "targets": decoder}, ids)
    return tf.data.Dataset.from_tensors(batch).repeat().apply(pipelines.update_weights(1)), int(np.count_nonzero(ids))


def one_step(initial, jit_compile):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = build_transformer(CONFIG)
        model.set_weights(initial)
        compile_model(model, CONFIG)
        model.optimizer.build(model.trainable_variables)
    dataset, tokens = batches()
    iterator = iter(strategy.distribute_datasets_from_function(lambda context: dataset))
    step = _train_step(model, strategy, jit_compile)
    stats, agreed = step(iterator, tf.constant([0.0, 1.0, 0.0]))  # this worker asks to stop on SIGTERM
    optimizer = model.optimizer
    # After one update Adam's first moment is (1 − β1)·g: the step's gradients.
    gradients = [
        optimizer._momentums[optimizer._get_variable_index(v)].numpy() / (1 - optimizer.beta_1)
        for v in model.trainable_variables
    ]
    assert len(gradients) == len(model.weights)  # every weight trains: get_weights() and gradients pair up
    return model.get_weights(), gradients, stats.numpy(), agreed.numpy(), tokens


def initial_weights(seed=3):
    """The model's initial weights, the same whichever tests ran before in this process.

    Keras's unseeded initializers draw their seeds from Python's ``random``,
    which the conftest seeds once per session, so every model built earlier
    (another file's) would change them. Its state is put back afterwards;
    ``keras.utils.set_random_seed`` would also clear TensorFlow's kernel cache.
    """
    state = random.getstate()
    random.seed(seed)
    try:
        return build_transformer(CONFIG).get_weights()
    finally:
        random.setstate(state)


def test_the_xla_step_takes_its_batch_outside_xla_and_makes_the_plain_steps_update():
    initial = initial_weights()
    # Before the fix: "Detected unsupported operations ... XLA_CPU_JIT: IteratorGetNext".
    compiled, compiled_gradients, stats, agreed, tokens = one_step(initial, jit_compile=True)
    plain, gradients, plain_stats, _, _ = one_step(initial, jit_compile=False)
    assert stats[1:].tolist() == [tokens, 8]  # target tokens and rows of the batch
    np.testing.assert_allclose(stats, plain_stats, rtol=1e-5)
    np.testing.assert_array_equal(agreed, [0.0, 1.0, 0.0])
    assert max(float(np.abs(a - b).max()) for a, b in zip(compiled, initial, strict=True)) > 1e-4  # it trained
    # The same gradients, to float32 round-off: measured ≤ 1.4e-6 of each array's largest (40 initializations).
    for a, b in zip(compiled_gradients, gradients, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))
    # The same update. Adam's first one moves a weight by lr·g / (|g| + ε/√(1 − β2)), ε/√(1 − β2) ≈ 7e-9
    # (ε = 1e-9): ±lr wherever |g| ≫ 7e-9, but where |g| is within a few hundred times that, the gradient's
    # round-off above (~1e-9) moves the weight by up to 2·lr (lr ≈ 5e-4), whatever the tolerance. Those few
    # weights (1 to 17 of 23,040 per initialization) are left out; the rest agree to 6e-8.
    steady = [np.abs(g) >= 1e-6 for g in gradients]
    assert sum(int(s.sum()) for s in steady) > 0.98 * sum(s.size for s in steady)
    for a, b, s in zip(compiled, plain, steady, strict=True):
        np.testing.assert_allclose(a[s], b[s], rtol=0, atol=1e-6)

"""The multi-worker loop's train step, in-process: XLA compiles the replica's step, not the iterator.

``--jit_compile`` under ``--strategy multi_worker`` is refused on CPU workers
(tests/training/test_distributed_options.py), and workers need processes; a
one-device strategy runs the same step function here, and XLA on one CPU device
works, so the step's structure is tested directly.
"""

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
    return model.get_weights(), stats.numpy(), agreed.numpy(), tokens


def test_the_xla_step_takes_its_batch_outside_xla_and_makes_the_plain_steps_update():
    initial = build_transformer(CONFIG).get_weights()
    # Before the fix: "Detected unsupported operations ... XLA_CPU_JIT: IteratorGetNext".
    compiled, stats, agreed, tokens = one_step(initial, jit_compile=True)
    plain, plain_stats, _, _ = one_step(initial, jit_compile=False)
    assert stats[1:].tolist() == [tokens, 8]  # target tokens and rows of the batch
    np.testing.assert_allclose(stats, plain_stats, rtol=1e-5)
    np.testing.assert_array_equal(agreed, [0.0, 1.0, 0.0])
    assert max(float(np.abs(a - b).max()) for a, b in zip(compiled, initial, strict=True)) > 1e-4  # it trained
    for a, b in zip(compiled, plain, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)

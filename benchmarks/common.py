"""Helpers shared by the benchmark scripts (no flags here: each script defines its own)."""

from __future__ import annotations

import time

import keras
import tensorflow as tf


def matmul_peak(dtype: str, n: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of the best of ``repeats`` ``n×n`` matmuls in ``dtype``: the MFU denominator."""
    a = tf.cast(tf.random.normal((n, n), dtype=tf.float32), dtype)
    matmul = tf.function(lambda x: tf.matmul(x, x))
    matmul(a).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


class StepTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each training step of a ``fit`` call (``times``)."""

    def on_train_begin(self, logs=None):
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)

"""What a run shows while it trains: a progress line per epoch, and per-step scalars in TensorBoard."""

from __future__ import annotations

import time

import keras
import tensorflow as tf

from tf_transformer.training.optimizers import current_learning_rate
from tf_transformer.training.schedules import horizon_of, last_update


def _number(value: float) -> str:
    """Counts as whole numbers (``459,200``), everything else to four significant digits."""
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


class ProgressLogger(keras.callbacks.Callback):
    """One line per epoch (and one a minute within long epochs), counting toward the real end of the run.

    Keras's own progress shows ``Epoch 1/N`` for the ``epochs`` that ``fit``
    was given, which for a run bounded by steps or by a time budget is not
    where it ends. This shows the optimizer steps done of ``train_steps`` (of
    the horizon once ``--schedule budget`` knows it, where the run stops) and,
    with a budget, the minutes used of ``max_minutes`` (the run stops at
    whichever comes first), with the epoch's metrics.
    """

    def __init__(
        self,
        train_steps: int,
        max_minutes: float | None = None,
        start: float | None = None,
        every_seconds: float = 60.0,
        print_fn=print,
        first_line: str | None = None,
    ):
        super().__init__()
        self.train_steps = train_steps
        self.max_minutes = max_minutes
        self.start = start
        self.every_seconds = every_seconds
        self.print_fn = print_fn
        self.first_line = first_line

    def on_train_begin(self, logs=None):
        if self.start is None:
            self.start = time.perf_counter()
        self._last = time.perf_counter()
        if self.first_line:
            self.print_fn(self.first_line, flush=True)

    def _where(self) -> str:
        step = int(self.model.optimizer.iterations.numpy())
        parts = [f"step {step}/{last_update(self.train_steps, horizon_of(self.model.optimizer))}"]
        minutes = (time.perf_counter() - self.start) / 60.0
        parts.append(f"{minutes:.1f}/{self.max_minutes:g} min" if self.max_minutes else f"{minutes:.1f} min")
        return " · ".join(parts)

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if now - self._last >= self.every_seconds:
            self._last = now
            loss = (logs or {}).get("loss")
            self.print_fn(f"  {self._where()}" + (f" · loss {float(loss):.4f}" if loss is not None else ""), flush=True)

    def on_epoch_end(self, epoch, logs=None):
        self._last = time.perf_counter()
        metrics = " · ".join(f"{key} {_number(float(value))}" for key, value in sorted((logs or {}).items()))
        self.print_fn(f"epoch {epoch + 1} · {self._where()} · {metrics}", flush=True)


class ThroughputMonitor(keras.callbacks.Callback):
    """TensorBoard scalars every ``every_steps`` updates: learning rate, target tokens/s and the step's loss.

    Epoch scalars (loss, validation loss, dev BLEU) come from Keras's
    ``TensorBoard`` callback, from the epoch's logs.
    """

    def __init__(self, log_dir: str, every_steps: int = 50):
        super().__init__()
        self.train_writer = tf.summary.create_file_writer(f"{log_dir}/train")
        self.every_steps = every_steps

    def on_train_begin(self, logs=None):
        self._time = time.perf_counter()
        self._tokens = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_tokens = 0.0

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        tokens = float(logs.get("target_tokens", 0.0))  # cumulative in the epoch
        self._tokens += max(tokens - self._epoch_tokens, 0.0)
        self._epoch_tokens = tokens
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.every_steps:
            return
        now = time.perf_counter()
        optimizer = self.model.optimizer
        learning_rate = current_learning_rate(optimizer)
        with self.train_writer.as_default(step=step):
            tf.summary.scalar("learning_rate", learning_rate)
            tf.summary.scalar("target_tokens_per_second", self._tokens / max(now - self._time, 1e-9))
            if "loss" in logs:
                tf.summary.scalar("step_loss", float(logs["loss"]))
        self._time, self._tokens = now, 0.0

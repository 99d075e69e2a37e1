"""Callbacks that decide where a run is and when it stops: data position, checkpoints, stop requests, step limit.

Every layout runs them: ``fit`` calls them itself, the multi-worker loop
through a ``keras.callbacks.CallbackList`` (:mod:`~tf_transformer.training.multi_worker`).
Progress lines and TensorBoard scalars are in :mod:`.progress`; dev BLEU and
attention images in :mod:`.dev_evaluation`; the best checkpoint and early
stopping in :mod:`.best`.
"""

from __future__ import annotations

import math
import signal
import threading
import time

import keras
import tensorflow as tf
from absl import logging

from tf_transformer import run_dir
from tf_transformer.training.optimizers import micro_batches_done
from tf_transformer.training.schedules import last_update


def _finite(logs) -> bool:
    loss = (logs or {}).get("loss")
    return loss is None or math.isfinite(float(loss))


class DataPosition(keras.callbacks.Callback):
    """Counts the micro-batches training has taken from its data: where a resumed run continues.

    Not the optimizer's step: under ``mixed_float16`` a step whose gradients
    overflow is skipped (the loss scale halves) without counting as an update,
    yet its batch was used. ``batches`` is a variable of the training checkpoint
    (:func:`~tf_transformer.training.resume.training_checkpoint`); put this
    callback first, so a checkpoint written at the end of a batch counts it.
    """

    def __init__(self, start: int = 0):
        super().__init__()
        self.batches = tf.Variable(start, dtype=tf.int64, trainable=False, name="data_position")

    def on_train_batch_end(self, batch, logs=None):
        self.batches.assign_add(1)


class StepCheckpoint(keras.callbacks.Callback):
    """Saves model and optimizer every ``every_steps`` updates and at each epoch end.

    Uses ``tf.train.CheckpointManager`` (keeps the last ``max_to_keep``; each
    checkpoint is complete once its index file is written, so a killed run
    leaves the previous one usable). Never saves after a non-finite loss, so
    with ``TerminateOnNaN`` the last good checkpoint stays the latest.
    """

    def __init__(self, manager: tf.train.CheckpointManager, every_steps: int | None, micro_steps: int = 1):
        super().__init__()
        self.manager = manager
        self.every_steps = every_steps
        self.micro_steps = micro_steps
        self._bad = False
        self._last_saved = None

    def _updates(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def at_update_boundary(self) -> bool:
        """False in the middle of a gradient accumulation (the update is not complete)."""
        return self.micro_steps == 1 or micro_batches_done(self.model.optimizer) % self.micro_steps == 0

    def save(self) -> str | None:
        """Saves now (once per step; never after a non-finite loss); returns the newest checkpoint."""
        if self._bad:
            return None
        step = self._updates()
        if step != self._last_saved:
            path = run_dir.save_checkpoint(self.manager, step)
            self._last_saved = step
            logging.info("Saved checkpoint %s", path)
        return self.manager.latest_checkpoint

    def note(self, logs) -> bool:
        """Records a non-finite loss in the batch's ``logs`` (nothing is saved after it); whether it was finite."""
        if not _finite(logs):
            self._bad = True
        return not self._bad

    def on_train_batch_end(self, batch, logs=None):
        if not self.note(logs):
            return
        step = self._updates()
        if self.every_steps and step and step % self.every_steps == 0 and self.at_update_boundary():
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        if _finite(logs):
            self.save()


class Preempted(Exception):
    """Training stopped on a signal after writing a checkpoint (see :class:`StopOnSignal`)."""

    def __init__(self, signal_name: str, checkpoint: str | None, step: int):
        super().__init__(f"{signal_name} at step {step}: saved {checkpoint}")
        self.signal_name = signal_name
        self.checkpoint = checkpoint
        self.step = step


class StopRequests(keras.callbacks.Callback):
    """Stops at the next update boundary when asked: by SIGTERM or SIGINT (preemption) or by a time budget.

    Preemptible VMs and Kubernetes evictions send SIGTERM and wait a grace period
    before SIGKILL; Ctrl-C sends SIGINT. The handler only records the signal: the
    checkpoint is written between steps, once the update is complete (never in the
    middle of a gradient accumulation), so the rerun resumes exactly. Training then
    ends by raising :class:`Preempted`, skipping the epoch's validation and dev
    BLEU, which the grace period may not cover; a signal that arrives during
    validation ends it at the next validation batch, with the checkpoint of the
    epoch's end. A second SIGINT interrupts at once.

    A time budget (``max_minutes``, counted from ``start``, a
    ``time.perf_counter()`` value, or else from the first batch) ends training
    at the next update boundary like the end of the run: the epoch's end
    (validation, checkpoint) follows.

    :meth:`wanted` is this process's view (:data:`REASONS`, in order). With
    several workers each must stop after the same step: the training loop sums
    every worker's wishes in the step's collective and sets :attr:`agreed`
    before the batch's callbacks run; in one process the wishes are the
    decision. Use as a context manager around training: the signal handlers are
    installed on entry (in the main thread only, where Python delivers
    signals) and restored on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    REASONS = ("time_budget", "SIGTERM", "SIGINT")

    def __init__(self, checkpoint: StepCheckpoint, max_minutes: float | None = None, start: float | None = None):
        super().__init__()
        self.checkpoint = checkpoint
        self.seconds = max_minutes * 60.0 if max_minutes else None
        self.start = start
        self.received: str | None = None
        self.agreed: list[bool] | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        return self

    def __exit__(self, *exc_info):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _handle(self, number, frame):
        if self.received and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(number).name
        logging.warning("%s received: saving a checkpoint at the end of this step, then stopping", self.received)

    def on_train_begin(self, logs=None):
        if self.start is None:
            self.start = time.perf_counter()

    def wanted(self) -> list[bool]:
        """This process's wishes to stop, one per name of :data:`REASONS`."""
        if self.start is None:
            self.start = time.perf_counter()
        budget = self.seconds is not None and time.perf_counter() - self.start >= self.seconds
        return [budget, self.received == "SIGTERM", self.received == "SIGINT"]

    def _requested(self) -> list[str]:
        wanted = self.agreed if self.agreed is not None else self.wanted()
        return [name for name, wish in zip(self.REASONS, wanted, strict=True) if wish]

    def _preempt(self, signals: list[str]):
        step = int(self.model.optimizer.iterations.numpy())
        raise Preempted(signals[0], self.checkpoint.save(), step)

    def on_train_batch_end(self, batch, logs=None):
        self.checkpoint.note(logs)  # whichever callback sees the batch first: no checkpoint after a NaN loss
        requested = self._requested()
        if not requested or not self.checkpoint.at_update_boundary():
            return
        self.model.stop_training = True
        signals = [name for name in requested if name != "time_budget"]
        if signals:
            self._preempt(signals)

    def on_test_batch_end(self, batch, logs=None):
        """A signal during the epoch's validation stops it: the checkpoint of the epoch's end, then stop."""
        self._signals_at_epoch_end()

    def on_epoch_end(self, epoch, logs=None):
        """A signal during validation (or before dev BLEU, which follows) stops before dev BLEU is computed."""
        self._signals_at_epoch_end()

    def _signals_at_epoch_end(self):
        # Every batch of the epoch is trained: the checkpoint is the epoch's (accumulators included, they
        # are the same on every replica: training/update.py), whether or not an update is complete.
        signals = [name for name in self._requested() if name != "time_budget"]
        if signals:
            self.model.stop_training = True
            self._preempt(signals)


class StopAtStep(keras.callbacks.Callback):
    """Stops training once the optimizer has made ``train_steps`` updates, or reached ``horizon`` (a
    variable; 0: not set), where a budget schedule's learning rate is zero."""

    def __init__(self, train_steps: int, horizon=None):
        super().__init__()
        self.train_steps = train_steps
        self.horizon = horizon

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= last_update(self.train_steps, self.horizon):
            self.model.stop_training = True

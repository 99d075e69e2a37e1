"""Callbacks for long runs: step-based checkpoints, a step limit, and TensorBoard monitoring."""

from __future__ import annotations

import math
import signal
import threading
import time

import keras
import tensorflow as tf
from absl import logging

from tf_transformer import run_dir
from tf_transformer.attention_figures import head_grid, png_bytes
from tf_transformer.attention_maps import penultimate
from tf_transformer.training.optimizers import current_learning_rate, micro_batches_done


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

    def on_train_batch_end(self, batch, logs=None):
        if not _finite(logs):
            self._bad = True
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


class StopOnSignal(keras.callbacks.Callback):
    """Preemption: on SIGTERM or SIGINT, a checkpoint at the next update boundary, then stop at once.

    Preemptible VMs and Kubernetes evictions send SIGTERM and wait a grace period
    before SIGKILL; Ctrl-C sends SIGINT. The handler only records the signal: the
    checkpoint is written between steps, once the update is complete (never in the
    middle of a gradient accumulation), so the rerun resumes exactly. Training then
    ends by raising :class:`Preempted`, skipping the epoch's validation and dev
    BLEU, which the grace period may not cover. A second SIGINT interrupts at once.

    Use as a context manager around ``fit``: the handlers are installed on entry
    (in the main thread only, where Python delivers signals) and restored on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, checkpoint: StepCheckpoint):
        super().__init__()
        self.checkpoint = checkpoint
        self.received: str | None = None
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

    def on_train_batch_end(self, batch, logs=None):
        if self.received and self.checkpoint.at_update_boundary():
            self.model.stop_training = True
            step = int(self.model.optimizer.iterations.numpy())
            raise Preempted(self.received, self.checkpoint.save(), step)


class StopAtStep(keras.callbacks.Callback):
    """Stops training once the optimizer has made ``train_steps`` updates."""

    def __init__(self, train_steps: int):
        super().__init__()
        self.train_steps = train_steps

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.train_steps:
            self.model.stop_training = True


class StopAfterMinutes(keras.callbacks.Callback):
    """Stops training once ``minutes`` of wall-clock time have passed (a budget, e.g. for demos).

    The clock starts at ``start`` (a ``time.perf_counter()`` value, e.g. taken
    before the vocabulary and data were prepared) or else when training begins.
    """

    def __init__(self, minutes: float, start: float | None = None):
        super().__init__()
        self.seconds = minutes * 60.0
        if start is not None:
            self._start = start

    def on_train_begin(self, logs=None):
        if not hasattr(self, "_start"):
            self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if time.perf_counter() - self._start >= self.seconds:
            self.model.stop_training = True


def _number(value: float) -> str:
    """Counts as whole numbers (``459,200``), everything else to four significant digits."""
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


class ProgressLogger(keras.callbacks.Callback):
    """One line per epoch (and one a minute within long epochs), counting toward the real end of the run.

    Keras's own progress shows ``Epoch 1/N`` for the ``epochs`` that ``fit``
    was given, which for a run bounded by steps or by a time budget is not
    where it ends. This shows the optimizer steps done of ``train_steps`` and,
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
    ):
        super().__init__()
        self.train_steps = train_steps
        self.max_minutes = max_minutes
        self.start = start
        self.every_seconds = every_seconds
        self.print_fn = print_fn

    def on_train_begin(self, logs=None):
        if self.start is None:
            self.start = time.perf_counter()
        self._last = time.perf_counter()

    def _where(self) -> str:
        step = int(self.model.optimizer.iterations.numpy())
        parts = [f"step {step}/{self.train_steps}"]
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


class TrainingMonitor(keras.callbacks.Callback):
    """TensorBoard scalars per step (learning rate, target tokens/s) and, per epoch,
    validation BLEU on a dev subset, a few sample translations as text and images
    of their attention.

    ``translate`` maps a list of source strings to hypotheses; BLEU is sacreBLEU
    on detokenized, cased text. ``attention`` maps a list of source strings to their
    :class:`~tf_transformer.attention_maps.AttentionMaps` (``setup.attention_fn``):
    the first ``attention_images`` dev sentences are drawn each epoch, their
    encoder–decoder attention per layer (heads averaged) and the encoder
    self-attention of the penultimate layer per head, which the paper's figures 3–5 show.
    """

    def __init__(
        self,
        log_dir: str,
        every_steps: int = 50,
        dev_sources=(),
        dev_references=(),
        translate=None,
        attention=None,
        attention_images: int = 3,
    ):
        super().__init__()
        self.attention = attention
        self.attention_images = attention_images
        self.train_writer = tf.summary.create_file_writer(f"{log_dir}/train")
        self.validation_writer = tf.summary.create_file_writer(f"{log_dir}/validation")
        self.every_steps = every_steps
        self.dev_sources = list(dev_sources)
        self.dev_references = list(dev_references)
        self.translate = translate
        self.last_bleu = None

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

    def on_epoch_end(self, epoch, logs=None):
        if not (self.translate and self.dev_sources):
            return
        import sacrebleu

        hypotheses = self.translate(self.dev_sources)
        bleu = sacrebleu.corpus_bleu(hypotheses, [self.dev_references])
        self.last_bleu = bleu.score
        if logs is not None:
            logs["val_bleu"] = bleu.score
        step = int(self.model.optimizer.iterations.numpy())
        samples = "\n\n".join(
            f"**source:** {s}  \n**reference:** {r}  \n**output:** {h}"
            for s, r, h in list(zip(self.dev_sources, self.dev_references, hypotheses, strict=True))[:4]
        )
        with self.validation_writer.as_default(step=step):
            tf.summary.scalar("bleu", bleu.score)
            tf.summary.text("sample_translations", samples)
        logging.info("epoch %d step %d: dev-subset BLEU %.2f", epoch + 1, step, bleu.score)
        if self.attention is not None and self.attention_images:
            self._attention_images(step)

    def _attention_images(self, step: int) -> None:
        """Images of the attention of the first ``attention_images`` dev sentences (see the class)."""
        sentences = self.dev_sources[: self.attention_images]
        for number, maps in enumerate(self.attention(sentences), start=1):
            layers = maps.cross.shape[0]
            layer = penultimate(layers)
            cross = head_grid(
                maps.cross.mean(axis=1),  # [layers, target, source]: heads averaged
                maps.target,
                maps.source,
                f"encoder-decoder attention, heads averaged (rows: target token predicted)\n{sentences[number - 1]}",
                columns=layers,
                panel_titles=[f"layer {index + 1}" for index in range(layers)],
            )
            encoder = head_grid(
                maps.encoder[layer],  # [heads, source, source]
                maps.source,
                maps.source,
                f"encoder self-attention, layer {layer + 1} of {layers}\n{sentences[number - 1]}",
            )
            with self.validation_writer.as_default(step=step):
                for name, figure in (("encoder_decoder", cross), (f"encoder_self_layer{layer + 1}", encoder)):
                    image = tf.io.decode_png(png_bytes(figure), channels=4)[None]  # [1, height, width, 4]
                    tf.summary.image(f"attention/{name}/sentence_{number}", image)


class TargetTokens(keras.metrics.Metric):
    """Counts non-padding target tokens (for tokens/s)."""

    def __init__(self, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", name="count", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(tf.reduce_sum(tf.cast(tf.not_equal(y_true, 0), tf.float32)))

    def result(self):
        # The value now, not the variable: Keras keeps the result in the epoch's logs and then
        # resets the variable for validation, which would overwrite the training count.
        return tf.identity(self.count)

    def reset_state(self):
        self.count.assign(0.0)

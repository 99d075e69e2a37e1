"""The best checkpoint by a dev metric, kept apart from the rolling ones, and early stopping on it.

Section 6.1 picks models by their dev score; fairseq (``checkpoint_best.pt``,
``--patience``) and OpenNMT-tf (``early_stopping``) keep the best checkpoint
and stop once the dev metric has not improved for a number of evaluations.
Here the dev evaluations are those of each epoch's end
(:mod:`~tf_transformer.training.dev_evaluation`): ``val_loss``, and the task's
score ``val_bleu`` (translation) or ``val_f1`` (parsing).

``--keep_best_by`` names the metric: ``loss`` (lower is better), the task's
own score (``bleu`` or ``f1``; higher is better), or ``score`` for whichever
that is. ``--early_stopping N`` stops after N evaluations in a row without a
strict improvement (by ``loss`` unless ``--keep_best_by`` says otherwise, as
fairseq's ``--best-checkpoint-metric``).

The best weights go to ``model_dir/best/ckpt-STEP`` (a ``CheckpointManager`` of
its own keeping one, written as every checkpoint is:
:func:`~tf_transformer.run_dir.save_checkpoint`) and ``model_dir/best.json``
says which, with the evaluations since (:data:`~tf_transformer.run_dir.BEST_FILE`). What decides the next
verdicts (the best value, its step, the evaluations since it) is a part of the
training checkpoint (:data:`~tf_transformer.training.resume.BEST`), written at
each epoch's end after the evaluation: a resumed run continues from the
state its checkpoint was written in, as an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import keras
import tensorflow as tf
from absl import logging

from tf_transformer import run_dir
from tf_transformer.files import save_json
from tf_transformer.training.options import OptionError

LOSS = "loss"
SCORE = "score"  # the task's dev score, whatever its name
METRICS = (LOSS, "bleu", "f1", SCORE)  # --keep_best_by's choices
STOPPED = "early_stopping"  # the summary's stopped_by when patience ran out


@dataclasses.dataclass(frozen=True)
class Metric:
    """A dev metric the best checkpoint is chosen by: its name, its key in the epoch's logs, its direction."""

    name: str  # "loss", "bleu", "f1"
    key: str  # "val_loss", "val_bleu", "val_f1"
    higher_is_better: bool

    def better(self, value: float, best: float) -> bool:
        """Strictly better (a NaN never is)."""
        return value > best if self.higher_is_better else value < best

    @property
    def worst(self) -> float:
        return -math.inf if self.higher_is_better else math.inf


def best_metric(keep_best_by: str | None, early_stopping: int | None, task) -> Metric | None:
    """The metric of ``--keep_best_by`` for ``task`` (``loss`` for ``--early_stopping`` alone), or ``None``.

    ``bleu`` for a parser (or ``f1`` for a translation model) is refused with the
    name of the task's own metric: a parser's dev score is EVALB F1, not BLEU.
    """
    if keep_best_by is None and not early_stopping:
        return None
    name = keep_best_by or LOSS
    if name == SCORE:
        name = task.metric
    if name == LOSS:
        return Metric(LOSS, "val_loss", higher_is_better=False)
    if name == task.metric:
        return Metric(name, f"val_{name}", higher_is_better=True)
    if name in METRICS:
        raise OptionError(
            f"--keep_best_by {name}: --task {task.name} scores its dev set by {task.metric.upper()}, not "
            f"{name.upper()}; use --keep_best_by {task.metric} (or score, the task's own metric, or loss)"
        )
    raise OptionError(f"--keep_best_by {name}: not a metric; use one of {', '.join(METRICS)}")


def check_options(options, task) -> Metric | None:
    """:func:`best_metric` of the run's options, after checking the dev evaluations it needs are made."""
    if options.early_stopping is not None and options.early_stopping < 1:
        raise OptionError(f"--early_stopping {options.early_stopping}: give a patience of 1 evaluation or more")
    metric = best_metric(options.keep_best_by, options.early_stopping, task)
    if metric is None:
        return None
    flag = f"--keep_best_by {options.keep_best_by}" if options.keep_best_by else "--early_stopping"
    if not options.dev_split:
        raise OptionError(f"{flag} compares the dev evaluations of each epoch's end: give a --dev_split")
    if metric.name != LOSS and not options.dev_bleu_sentences:
        raise OptionError(
            f"{flag} needs the dev {metric.name.upper()} of each epoch: --dev_bleu_sentences 0 turns it off "
            "(give a number of sentences, or --keep_best_by loss)"
        )
    return metric


class BestState(tf.Module):
    """What the next verdicts depend on, saved in the training checkpoint (restored on resume)."""

    def __init__(self, metric: Metric):
        super().__init__(name="best")
        self.metric = tf.Variable(metric.name, dtype=tf.string, trainable=False, name="metric")
        self.value = tf.Variable(metric.worst, dtype=tf.float64, trainable=False, name="value")
        self.step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="step")  # -1: no evaluation yet
        self.epoch = tf.Variable(-1, dtype=tf.int64, trainable=False, name="epoch")  # from 1
        self.evaluations = tf.Variable(0, dtype=tf.int64, trainable=False, name="evaluations")
        self.since_best = tf.Variable(0, dtype=tf.int64, trainable=False, name="since_best")

    def reset(self, metric: Metric) -> None:
        self.metric.assign(metric.name)
        self.value.assign(metric.worst)
        self.step.assign(-1)
        self.epoch.assign(-1)
        self.evaluations.assign(0)
        self.since_best.assign(0)


class BestCheckpoint(keras.callbacks.Callback):
    """At each epoch's end: a better dev ``metric`` saves the weights as the best; ``patience`` evaluations in
    a row without one stop training (see the module).

    Args:
      metric: the :class:`Metric` compared (:func:`check_options`).
      manager: a ``CheckpointManager`` of the model's weights alone (``max_to_keep=1``) in a ``best``
        directory: the run's (the chief's) or a worker's own.
      patience: ``--early_stopping`` (``None``: never stop).
      marker: where ``best.json`` is written (``None``: not by this process, a worker other than the chief).
      agree: under ``MultiWorkerMirroredStrategy``, a function giving every worker the chief's value of a
        number (a collective), so that all save and stop alike.

    Place it after the dev evaluation (which puts ``val_bleu`` in the logs) and before the checkpoint of the
    epoch's end, which then holds the verdict (:class:`BestState`).
    """

    def __init__(
        self,
        metric: Metric,
        manager: tf.train.CheckpointManager,
        patience: int | None = None,
        marker: str | None = None,
        agree: Callable[[float], float] | None = None,
    ):
        super().__init__()
        self.metric = metric
        self.manager = manager
        self.patience = patience
        self.marker = marker
        self.agree = agree
        self.state = BestState(metric)

    def restored(self) -> None:
        """After a resume: a state kept for another metric (``--keep_best_by`` changed) starts afresh."""
        kept = self.state.metric.numpy().decode()
        if kept != self.metric.name:
            logging.warning(
                "The checkpoint tracked the best by %s, this run by %s: the best is tracked afresh",
                kept or "nothing",
                self.metric.name,
            )
            self.state.reset(self.metric)

    def exhausted(self) -> bool:
        """Whether the patience has run out: the run stops (and a rerun trains no further)."""
        return bool(self.patience) and int(self.state.since_best.numpy()) >= self.patience

    def summary(self) -> dict | None:
        """The best so far, as ``best.json`` says it (``None`` before the first evaluation)."""
        state = self.state
        if int(state.step.numpy()) < 0:
            return None
        return {
            "metric": self.metric.name,
            "value": float(state.value.numpy()),
            "step": int(state.step.numpy()),
            "epoch": int(state.epoch.numpy()),
            "evaluations": int(state.evaluations.numpy()),
            "evaluations_since_best": int(state.since_best.numpy()),
        }

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.metric.key)
        if value is None:
            logging.warning("No %s at the end of epoch %d: the best checkpoint is not compared", self.metric.key, epoch)
            return
        value = float(value)
        if self.agree is not None:  # the workers' values may differ in the last bit: the chief's decides
            value = self.agree(value)
        state = self.state
        state.evaluations.assign_add(1)
        step = int(self.model.optimizer.iterations.numpy())
        if self.metric.better(value, float(state.value.numpy())):
            state.value.assign(value)
            state.step.assign(step)
            state.epoch.assign(epoch + 1)
            state.since_best.assign(0)
            self._save(step)
        else:
            state.since_best.assign_add(1)
            logging.info(
                "dev %s %.4f: not better than %.4f at step %d (%d evaluation(s) since)",
                self.metric.name,
                value,
                float(state.value.numpy()),
                int(state.step.numpy()),
                int(state.since_best.numpy()),
            )
        self._mark()
        if self.exhausted():
            logging.info(
                "Early stopping: no better dev %s in %d evaluations; the best is step %d's",
                self.metric.name,
                self.patience,
                int(state.step.numpy()),
            )
            self.model.stop_training = True

    def _save(self, step: int) -> None:
        """The weights as the best (``best.json`` names them after: :meth:`_mark`)."""
        path = run_dir.save_checkpoint(self.manager, step)
        logging.info("dev %s %.4f: the best so far, saved %s", self.metric.name, float(self.state.value.numpy()), path)

    def _mark(self) -> None:
        """``best.json``: the best checkpoint, its value and step, the evaluations since it (after each
        evaluation, written whole; it names a new best only once its checkpoint is written, and
        :func:`~tf_transformer.run_dir.best_checkpoint` copes with the moment between)."""
        summary = self.summary()
        if self.marker is None or summary is None:
            return
        path = os.path.join(self.manager.directory, f"ckpt-{summary['step']}")  # as save_checkpoint names it
        save_json(self.marker, {**summary, "checkpoint": os.path.relpath(path, os.path.dirname(self.marker))})

"""The training entry point behind ``tft-train``, and its ``fit`` driver (one process, ``MirroredStrategy``).

The model directory holds everything later commands need: ``config.json`` (the
model config and the run options), ``sp.model`` (the shared vocabulary),
``checkpoints/`` (model and optimizer, the last K), ``logs/`` (TensorBoard) and
``data_cache/`` (tokenized data). :func:`train` resolves the options for the
machine, prepares the run (:mod:`~tf_transformer.training.preparation`) and hands it to
``fit`` or, under ``MultiWorkerMirroredStrategy``, to the workers' loop
(:mod:`~tf_transformer.training.multi_worker`).
"""

from __future__ import annotations

import math
import sys
import time

import keras
from absl import logging

from configs import RunOptions, TransformerConfig
from tf_transformer.files import first_line
from tf_transformer.training import preparation
from tf_transformer.training.callbacks import Preempted
from tf_transformer.training.cluster import LOST, Cluster, ClusterError
from tf_transformer.training.multi_worker import train_multi_worker
from tf_transformer.training.options import resolve
from tf_transformer.training.recipe import compile_model
from tf_transformer.training.strategy import make_strategy, set_precision

__all__ = ["compile_model", "train"]


def train(config: TransformerConfig, options: RunOptions, model_dir: str, budget_start: float | None = None) -> dict:
    """Trains (or resumes) a model in ``model_dir``; returns a summary dict.

    ``budget_start``: the ``time.perf_counter()`` from which ``options.max_minutes``
    counts (e.g. before the data was prepared); by default the first step.
    The run's precision is Keras' global dtype policy while it trains; the caller's
    is restored on return, so that a model built next in the same process (an
    export, a dev translation) computes as it would in a new one, not in the
    run's mixed precision.
    """
    policy = keras.config.dtype_policy()
    try:
        return _train(config, options, model_dir, budget_start)
    finally:
        keras.config.set_dtype_policy(policy)


def _train(config: TransformerConfig, options: RunOptions, model_dir: str, budget_start: float | None) -> dict:
    # First: MultiWorkerMirroredStrategy must configure collectives before TensorFlow starts.
    strategy = make_strategy(options.strategy)
    keras.utils.set_random_seed(options.seed)  # initialization and dropout; data order uses the seed too
    resolved = resolve(options, strategy)
    set_precision(resolved.options.precision)
    if options.strategy != "multi_worker":
        return _fit(preparation.prepare(config, resolved, model_dir, strategy, budget_start=budget_start))
    cluster = Cluster(strategy)
    try:
        prepared = preparation.prepare(config, resolved, model_dir, strategy, cluster, budget_start)
    except LOST as error:  # building the model, restoring, agreeing on the start
        raise ClusterError(
            f"{cluster.name}: lost contact with the other workers while starting ({first_line(error)}). "
            "A worker stopped, or stopped answering the coordination service's heartbeats; "
            "see its log, then run every worker's command again"
        ) from None
    return train_multi_worker(prepared)


def _fit(prepared: preparation.PreparedRun) -> dict:
    """Trains a prepared run with Keras's ``fit``."""
    model = prepared.model
    done_micro = prepared.done_micro
    start = time.perf_counter()
    history = {}
    stopped_by = None
    # A run of a number of epochs ends with its data; one of a number of steps ends at StopAtStep: under
    # mixed_float16 a step skipped on overflow takes a batch without counting, so fit gets epochs to spare.
    if not prepared.finished():
        # Resume where the checkpoint was written: the stream starts at the first
        # micro-batch not yet trained on (epochs depend only on the seed and their
        # index, so only the current epoch is rebuilt) in one fit call, so the data
        # is iterated once, exactly as in an uninterrupted run. After a
        # mid-epoch resume, epoch boundaries (validation, BLEU) shift by the part of
        # the epoch already done; the step count and the batches are unchanged.
        steps_per_epoch = prepared.inputs.steps_per_epoch
        initial_epoch = done_micro // steps_per_epoch
        epochs = (
            initial_epoch + math.ceil((prepared.inputs.total_micro - done_micro) / steps_per_epoch)
            if prepared.by_epochs
            else sys.maxsize
        )
        try:
            with prepared.callbacks.stop_requests:
                result = model.fit(
                    prepared.stream(),
                    validation_data=prepared.inputs.validation,
                    epochs=epochs,
                    initial_epoch=initial_epoch,
                    steps_per_epoch=steps_per_epoch,
                    callbacks=prepared.callbacks.all,
                    shuffle=False,  # the pipeline shuffles (fit's shuffle would be ignored, with a warning)
                    verbose=0,  # ProgressLogger: Keras's "Epoch 1/N" counts toward the epochs given to fit
                )
            history = {key: [float(v) for v in values] for key, values in result.history.items()}
        except Preempted as stop:
            stopped_by = stop.signal_name
            logging.warning(
                "Stopped by %s at step %d with checkpoint %s: run the same command again to resume",
                stop.signal_name,
                stop.step,
                stop.checkpoint,
            )
    return preparation.finish(prepared, time.perf_counter() - start, history, stopped_by)

"""The training driver behind ``tft-train``: data, vocabulary, model, ``fit``, checkpoints, resume.

The model directory holds everything later commands need: ``config.json`` (the
model config and the run options), ``sp.model`` (the shared vocabulary),
``checkpoints/`` (model and optimizer, the last K), ``logs/`` (TensorBoard) and
``data_cache/`` (tokenized data).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

import keras
import tensorflow as tf
from absl import logging

import pipelines
from configs import RunOptions, TransformerConfig
from tf_transformer import run_dir
from tf_transformer.model import build_transformer
from tf_transformer.training import resume
from tf_transformer.training.callbacks import (
    DataPosition,
    Preempted,
    ProgressLogger,
    StepCheckpoint,
    StopAfterMinutes,
    StopAtStep,
    StopOnSignal,
    TrainingMonitor,
)
from tf_transformer.training.multi_worker import train_multi_worker
from tf_transformer.training.optimizers import micro_batches_done
from tf_transformer.training.setup import (
    attention_fn,
    check_jit_compile,
    check_model_dir,
    compile_model,
    dev_data,
    initialize_from,
    total_micro_batches,
    training_data,
    translate_fn,
    update_count,
    weighted_stream,
)
from tf_transformer.training.strategy import default_jit_compile, make_strategy, set_precision

__all__ = ["RunOptions", "compile_model", "train", "translate_fn"]


def train(config: TransformerConfig, options: RunOptions, model_dir: str) -> dict:
    """Trains (or resumes) a model in ``model_dir``; returns a summary dict."""
    # First: MultiWorkerMirroredStrategy must configure collectives before TensorFlow starts.
    strategy = make_strategy(options.strategy)
    keras.utils.set_random_seed(options.seed)  # initialization and dropout; data order uses the seed too
    set_precision(options.precision)
    if options.strategy == "multi_worker":  # the chief checks model_dir; the others compare with the chief's run
        return train_multi_worker(config, options, model_dir, strategy)
    check_model_dir(model_dir, config)
    jit_compile = default_jit_compile() if options.jit_compile is None else options.jit_compile
    check_jit_compile(strategy, jit_compile)
    accumulate = max(1, options.accumulate_steps)
    replicas = strategy.num_replicas_in_sync

    run = {**dataclasses.asdict(options), "num_replicas": replicas}
    resuming = tf.train.get_checkpoint_state(run_dir.checkpoint_dir(model_dir)) is not None
    if resuming:
        resume.check_unchanged(model_dir, config, run)  # before config.json is rewritten
    elif options.init_from:
        source_dir, init_checkpoint = resume.source_run(options.init_from)
        resume.take_vocabulary(model_dir, source_dir)
    corpus = pipelines.find_split(options.data, options.train_split, options.src, options.tgt)
    tokenizer = run_dir.make_vocabulary(
        model_dir, corpus, options.vocab_size or config.vocab_size, options.vocab_model_type, options.seed
    )
    config = config.replace(vocab_size=tokenizer.vocab_size)
    if options.init_from and not resuming:
        resume.check_architecture(config, run_dir.load_run(source_dir)[0], source_dir)
    run_dir.save_run(model_dir, config, run)
    data = training_data(corpus, tokenizer, config, options, replicas, jit_compile, model_dir)
    steps_per_epoch = options.steps_per_epoch or data.batches_per_epoch
    total_micro = total_micro_batches(config, options, steps_per_epoch)
    validation, dev_sources, dev_references = dev_data(tokenizer, config, options, replicas, jit_compile, model_dir)

    with strategy.scope():
        model = build_transformer(config)
        compile_model(model, config, accumulate, jit_compile)
        model.optimizer.build(model.trainable_variables)
    position = DataPosition()
    checkpoint = resume.training_checkpoint(model, data_position=position.batches)
    manager = tf.train.CheckpointManager(
        checkpoint, run_dir.checkpoint_dir(model_dir), max_to_keep=options.keep_checkpoints
    )
    resumed = run_dir.restore_newest_readable(lambda path: resume.restorable(checkpoint, path), manager)
    if resumed:
        logging.info("Resumed from %s", resumed)
    elif options.init_from:
        initialize_from(model, source_dir, init_checkpoint)
        logging.info("Initialized the weights from %s; the optimizer and the schedule start at step 0", init_checkpoint)
    if resumed and not resume.holds(resumed, resume.POSITION):  # written by an older version
        position.batches.assign(micro_batches_done(model.optimizer))
    done_micro = int(position.batches.numpy())
    log_dir = os.path.join(model_dir, "logs")
    monitor = TrainingMonitor(
        log_dir,
        every_steps=options.log_every,
        dev_sources=dev_sources,
        dev_references=dev_references,
        translate=translate_fn(model, tokenizer, config.extra_decode_length) if dev_sources else None,
        attention=attention_fn(model, tokenizer, config.extra_decode_length) if dev_sources else None,
        attention_images=options.attention_images,
    )
    train_steps = update_count(total_micro, accumulate)
    checkpointer = StepCheckpoint(manager, options.checkpoint_every, accumulate)
    stop_on_signal = StopOnSignal(checkpointer)
    callbacks = [
        position,  # first: a checkpoint written at the end of a batch counts it
        keras.callbacks.TerminateOnNaN(),
        checkpointer,
        stop_on_signal,
        StopAtStep(train_steps),
        monitor,
        keras.callbacks.TensorBoard(log_dir, update_freq="epoch"),
    ]
    if options.verbose:  # after the monitor, whose dev BLEU it shows
        callbacks.insert(6, ProgressLogger(train_steps, options.max_minutes, options.budget_start))
    if options.max_minutes:
        callbacks.insert(4, StopAfterMinutes(options.max_minutes, options.budget_start))
    start = time.perf_counter()
    history = {}
    stopped_by = None
    # A run of a number of epochs ends with its data; one of a number of steps ends at StopAtStep: under
    # mixed_float16 a step skipped on overflow takes a batch without counting, so fit gets epochs to spare.
    by_epochs = bool(options.epochs and not options.train_steps)
    steps_left = int(model.optimizer.iterations.numpy()) < train_steps
    if (done_micro < total_micro) if by_epochs else steps_left:
        # Resume where the checkpoint was written: the stream starts at the first
        # micro-batch not yet trained on (epochs depend only on the seed and their
        # index, so only the current epoch is rebuilt) in one fit call, so the data
        # is iterated once, exactly as in an uninterrupted run. After a
        # mid-epoch resume, epoch boundaries (validation, BLEU) shift by the part of
        # the epoch already done; the step count and the batches are unchanged.
        initial_epoch = done_micro // steps_per_epoch
        epochs = initial_epoch + math.ceil((total_micro - done_micro) / steps_per_epoch) if by_epochs else sys.maxsize
        try:
            with stop_on_signal:
                result = model.fit(
                    weighted_stream(data, done_micro, accumulate),
                    validation_data=validation,
                    epochs=epochs,
                    initial_epoch=initial_epoch,
                    steps_per_epoch=steps_per_epoch,
                    callbacks=callbacks,
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
    seconds = time.perf_counter() - start
    summary = {
        "model_dir": model_dir,
        "config": config.name,
        "params": int(model.count_params()),
        "steps": int(model.optimizer.iterations.numpy()),
        "steps_per_epoch": steps_per_epoch,
        "train_seconds": round(seconds, 1),
        "stats": dataclasses.asdict(data.stats),
        "history": history,
        "dev_bleu": monitor.last_bleu,
        "latest_checkpoint": manager.latest_checkpoint,
        "stopped_by": stopped_by,
    }
    run_dir.save_json(os.path.join(model_dir, "train_summary.json"), summary)
    return summary

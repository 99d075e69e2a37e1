"""Training on several machines: ``MultiWorkerMirroredStrategy`` driven by a loop of our own.

Keras 3 ``fit`` fails under ``MultiWorkerMirroredStrategy``
(keras-team/keras#20585), so workers run this loop. It trains exactly as
``fit`` does (:mod:`~tf_transformer.training.setup`): same model, loss,
optimizer, schedule, global batches and callbacks, and the same update:

* every worker builds the same global batches; a worker of ``M`` replicas
  feeds them ``M`` consecutive parts of each (``pipelines.replica_parts``), and
  the loss weights each token by ``1 / T`` for the ``T`` tokens of the whole
  update (``pipelines.update_weights``), so N machines × M GPUs make the update
  one device makes on the whole batch;
* one vocabulary and one run directory: the chief (worker 0) makes or takes
  ``sp.model`` and writes ``config.json`` in ``model_dir``, which every worker
  must see (a shared filesystem, or a path ``tf.io.gfile`` reads such as
  ``gs://``); the others wait for a marker carrying this launch's token, sent
  to them by a collective, so a stale or unshared directory is an error, not a
  worker training with a vocabulary of its own;
* every decision that ends or pauses training is agreed: the step limit and
  the epochs are counted alike; a time budget or a signal seen by one worker
  travels with the next step's collective, so all stop after the same step
  and write the same checkpoint;
* a worker that dies or stops answering is noticed by the heartbeats of
  TensorFlow's coordination service (within seconds), which abort the
  others' collectives: they stop with an error saying how to resume. No
  per-collective timeout: TF keeps that for debugging (a thread per collective).

All workers save (saving runs collectives): the chief into ``model_dir``, the
others into ``model_dir/.worker-<i>``, which only they read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

import pipelines
from configs import RunOptions, TransformerConfig
from tf_transformer import run_dir
from tf_transformer.model import build_transformer
from tf_transformer.training import resume
from tf_transformer.training.callbacks import (
    DataPosition,
    ProgressLogger,
    StepCheckpoint,
    StopAtStep,
    StopOnSignal,
    TrainingMonitor,
)
from tf_transformer.training.losses import TokenPerplexity
from tf_transformer.training.optimizers import micro_batches_done
from tf_transformer.training.setup import (
    OptionError,
    attention_fn,
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

MARKER = "cluster.json"
# Why a worker asks the others to stop after this step (summed over workers by a collective).
_REQUESTS = ("time_budget", "SIGTERM", "SIGINT")
# How a lost worker shows in the survivors' collectives.
_LOST = (
    tf.errors.DeadlineExceededError,
    tf.errors.UnavailableError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)


class ClusterError(RuntimeError):
    """The workers cannot train together (a worker lost, a directory not shared); the message says what to do."""


def replica_dataset_fn(stream: tf.data.Dataset):
    """``dataset_fn`` for ``distribute_datasets_from_function``: this pipeline's parts of each global batch."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        parts = pipelines.replica_parts(
            context.input_pipeline_id, context.num_input_pipelines, context.num_replicas_in_sync
        )
        return stream.apply(parts)

    return dataset_fn


class _Cluster:
    """This worker's place in the cluster, and a sum over all workers (a collective)."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict() if resolver else {}
        self.task_type = resolver.task_type if spec else None
        self.task_id = int(resolver.task_id or 0) if spec else 0
        self.is_chief = self.task_type in (None, "chief") or (self.task_type == "worker" and self.task_id == 0)
        self.name = f"{self.task_type or 'worker'} {self.task_id}"

        @tf.function
        def total(values):  # a cross-replica reduction is an all-reduce: every worker gets the sum
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(values,)), axis=None)

        self._total = total

    def sum(self, values) -> np.ndarray:
        """Elementwise sum over the workers' ``values`` (each worker's one replica counts once)."""
        local = len(self.strategy.extended.worker_devices)  # replicas on this worker each add the value
        return self._total(tf.constant(np.asarray(values, np.float64) / local)).numpy()

    def from_chief(self, value: int) -> int:
        """The chief's ``value`` on every worker (a sum in which the others give 0)."""
        return int(round(float(self.sum([value if self.is_chief else 0])[0])))


def _wait_for_chief(model_dir: str, token: int, seconds: float, name: str) -> None:
    """Waits until the chief has written this launch's marker in ``model_dir``: then its files are there."""
    marker = os.path.join(model_dir, MARKER)
    deadline = time.monotonic() + seconds
    seen = None
    while time.monotonic() < deadline:
        if tf.io.gfile.exists(marker):
            try:
                seen = json.loads(tf.io.gfile.GFile(marker).read()).get("token")
            except (ValueError, tf.errors.OpError):
                seen = None  # being written
            if seen == token:
                return
        time.sleep(0.5)
    found = "holds the marker of another launch" if seen is not None else f"has no {MARKER}"
    raise ClusterError(
        f"{name}: waited {seconds:g} s for the chief (worker 0) to prepare {model_dir}, which {found}. Every worker "
        "must see the chief's --model_dir: put it on a shared filesystem, or use a path tf.io.gfile reads on all "
        "machines (gs://…). If the chief is still training the vocabulary, raise --worker_timeout, or put a "
        "prepared sp.model in --model_dir"
    )


# Options each worker sets for itself: when its own time budget starts counting, how it prints progress.
# Each worker's own: its clock (the workers agree through the step's collective to stop at the first budget to
# run out), how long it waits for the chief's files, and what it prints.
_OWN_OPTIONS = frozenset({"budget_start", "max_minutes", "worker_timeout", "verbose"})


def differing_options(chief: tuple[TransformerConfig, dict], worker: tuple[TransformerConfig, dict]) -> list[str]:
    """Each option and model-config field ``worker`` sets otherwise than ``chief``, with both values.

    Both are ``(model config, run options)`` as ``config.json`` holds them. Every
    worker must train as the chief does: another step count, schedule or
    checkpoint cadence would leave the workers' collectives unmatched, another
    model or dropout would train a model other than the one the chief saves.
    Options are compared as they take effect (a preset's ``--tokens`` given
    explicitly is no change); the vocabulary size is that of the chief's
    ``sp.model``, not compared.
    """
    (chief_config, chief_run), (config, run) = chief, worker

    def effective(config: TransformerConfig, run: dict) -> dict:
        values = {**run, **resume.stream_options(config, run)}
        return {**values, "jit_compile": bool(values.get("jit_compile"))}  # None is off under multi_worker

    theirs, ours = effective(chief_config, chief_run), effective(config, run)
    names = [*theirs, *(name for name in ours if name not in theirs)]
    differing = [
        f"--{name} {theirs.get(name)} on the chief, {ours.get(name)} here"
        for name in names
        if name not in _OWN_OPTIONS and theirs.get(name) != ours.get(name)
    ]
    for field in dataclasses.fields(config):
        theirs, ours = getattr(chief_config, field.name), getattr(config, field.name)
        if field.name != "vocab_size" and theirs != ours:
            flag = "--config" if field.name == "name" else f"--set {field.name}"
            differing.append(f"{flag} {theirs} on the chief, {ours} here")
    return differing


def _check_options(options: RunOptions) -> None:
    if options.precision == "mixed_float16":
        raise OptionError(
            "--precision mixed_float16 is not supported with --strategy multi_worker (its loss scaling would skip "
            "steps on some workers' say); use mixed_bfloat16 or float32"
        )
    if options.jit_compile and not tf.config.list_logical_devices("GPU"):
        raise OptionError(
            "--jit_compile with --strategy multi_worker is supported on GPU workers only (XLA on CPUs recompiles "
            "for every batch shape and is untested with collectives here); drop --jit_compile (off by default "
            "on CPUs)"
        )


def train_multi_worker(config: TransformerConfig, options: RunOptions, model_dir: str, strategy) -> dict:
    """Trains (or resumes) in ``model_dir`` as one worker of ``strategy``; returns this worker's summary."""
    _check_options(options)
    cluster = _Cluster(strategy)
    try:
        return _train(config, options, model_dir, strategy, cluster)
    except _LOST as error:  # outside the training loop: building the model, restoring, agreeing on the start
        raise ClusterError(
            f"{cluster.name}: lost contact with the other workers while starting ({run_dir.first_line(error)}). "
            "A worker stopped, or stopped answering the coordination service's heartbeats; "
            "see its log, then run every worker's command again"
        ) from None


def _train(config, options, model_dir, strategy, cluster) -> dict:
    jit_compile = bool(options.jit_compile)
    accumulate = max(1, options.accumulate_steps)
    replicas = strategy.num_replicas_in_sync
    if cluster.is_chief:
        check_model_dir(model_dir, config)
    work_dir = model_dir if cluster.is_chief else os.path.join(model_dir, f".worker-{cluster.task_id}")
    tf.io.gfile.makedirs(work_dir)
    run = {**dataclasses.asdict(options), "num_replicas": replicas}

    try:
        token = cluster.from_chief(secrets.randbelow(2**48) + 1)
    except _LOST as error:
        raise ClusterError(f"{cluster.name}: the other workers did not answer ({run_dir.first_line(error)})") from None
    resuming = tf.train.get_checkpoint_state(run_dir.checkpoint_dir(model_dir)) is not None
    source_dir = init_checkpoint = None
    if options.init_from and not resuming:
        source_dir, init_checkpoint = resume.source_run(options.init_from)
    corpus = pipelines.find_split(options.data, options.train_split, options.src, options.tgt)
    if cluster.is_chief:
        if resuming:
            resume.check_unchanged(model_dir, config, run)
        elif source_dir:
            resume.take_vocabulary(model_dir, source_dir)
        tokenizer = run_dir.make_vocabulary(
            model_dir, corpus, options.vocab_size or config.vocab_size, options.vocab_model_type, options.seed
        )
        config = config.replace(vocab_size=tokenizer.vocab_size)
        if source_dir:
            resume.check_architecture(config, run_dir.load_run(source_dir)[0], source_dir)
        run_dir.save_run(model_dir, config, run)
        run_dir.save_json(os.path.join(model_dir, MARKER), {"token": token, "workers": _workers(strategy)})
        differing = []
    else:
        _wait_for_chief(model_dir, token, options.worker_timeout, cluster.name)
        stored, chief_run = run_dir.load_run(model_dir)  # this launch's: written before the marker
        config = config.replace(vocab_size=stored.vocab_size)
        differing = differing_options((stored, chief_run), (config, run))
        tokenizer = pipelines.Tokenizer(run_dir.vocabulary_path(model_dir))
    # Every worker learns whether one was started otherwise than the chief: then all stop, before any step.
    refused = int(round(float(cluster.sum([1 if differing else 0])[0])))
    if differing:
        raise OptionError(
            f"{cluster.name} was started with options other than the chief's (worker 0): {'; '.join(differing)}. "
            "Every worker must run the same tft-train command (only TF_CONFIG differs)"
        )
    if refused:
        raise ClusterError(
            f"{cluster.name}: {refused} other worker(s) were started with options other than the chief's and "
            "stopped (their errors name the options); run the same tft-train command on every worker"
        )

    data = training_data(corpus, tokenizer, config, options, replicas, jit_compile, model_dir)
    steps_per_epoch = options.steps_per_epoch or data.batches_per_epoch
    total_micro = total_micro_batches(config, options, steps_per_epoch)
    train_steps = update_count(total_micro, accumulate)
    validation, dev_sources, dev_references = dev_data(tokenizer, config, options, replicas, jit_compile, model_dir)

    with strategy.scope():
        model = build_transformer(config)
        compile_model(model, config, accumulate)
        model.optimizer.build(model.trainable_variables)
    position = DataPosition()
    checkpoint = resume.training_checkpoint(model, data_position=position.batches)
    chief_manager = tf.train.CheckpointManager(
        checkpoint, run_dir.checkpoint_dir(model_dir), max_to_keep=options.keep_checkpoints
    )
    manager = (
        chief_manager
        if cluster.is_chief
        else tf.train.CheckpointManager(checkpoint, os.path.join(work_dir, "checkpoints"), max_to_keep=1)
    )
    # The chief picks the newest readable checkpoint; every worker restores that one.
    resumed = (
        run_dir.restore_newest_readable(lambda p: resume.restorable(checkpoint, p), chief_manager)
        if (cluster.is_chief)
        else None
    )
    number = cluster.from_chief(int(resumed.rsplit("-", 1)[1]) if resumed else 0)
    if number and not cluster.is_chief:
        resumed = os.path.join(run_dir.checkpoint_dir(model_dir), f"ckpt-{number}")
        resume.restorable(checkpoint, resumed).restore(resumed).assert_existing_objects_matched()
    if resumed:
        logging.info("%s resumed from %s", cluster.name, resumed)
        if not resume.holds(resumed, resume.POSITION):
            position.batches.assign(micro_batches_done(model.optimizer))
    elif source_dir:
        initialize_from(model, source_dir, init_checkpoint)
    done_micro = int(position.batches.numpy())

    distributed = strategy.distribute_datasets_from_function(
        replica_dataset_fn(weighted_stream(data, done_micro, accumulate))
    )
    step = _train_step(model, strategy, jit_compile)
    evaluate = _evaluation(model, validation) if validation is not None else None

    checkpointer = StepCheckpoint(manager, options.checkpoint_every, accumulate)
    signals = StopOnSignal(checkpointer)  # only records the signal: the loop agrees on it with the others
    monitor = TrainingMonitor(
        os.path.join(work_dir, "logs"),
        every_steps=options.log_every,
        dev_sources=dev_sources,
        dev_references=dev_references,
        translate=translate_fn(model, tokenizer, config.extra_decode_length) if dev_sources else None,
        # Images only where someone reads them: the chief's logs (the others' go to .worker-<i>).
        attention=attention_fn(model, tokenizer, config.extra_decode_length)
        if dev_sources and cluster.is_chief
        else None,
        attention_images=options.attention_images,
    )
    callbacks = [position, checkpointer, StopAtStep(train_steps), monitor]
    if options.verbose and cluster.is_chief:
        callbacks.append(ProgressLogger(train_steps, options.max_minutes, options.budget_start))
    callbacks = keras.callbacks.CallbackList(callbacks, model=model)
    epoch_writer = tf.summary.create_file_writer(os.path.join(work_dir, "logs", "train"))

    by_epochs = bool(options.epochs and not options.train_steps)
    budget_start = options.budget_start or time.perf_counter()
    start = time.perf_counter()
    history: dict[str, list[float]] = {}
    stopped_by = None
    micro = done_micro
    iterator = iter(distributed)
    model.stop_training = False
    finished = micro >= total_micro if by_epochs else int(model.optimizer.iterations.numpy()) >= train_steps
    try:
        with signals:
            if not finished:
                callbacks.on_train_begin()
            while not finished:
                epoch, offset = divmod(micro, steps_per_epoch)
                callbacks.on_epoch_begin(epoch)
                losses, rows, tokens = [], [], 0.0
                for batch in range(offset, steps_per_epoch):
                    wanted = [
                        bool(options.max_minutes) and time.perf_counter() - budget_start >= options.max_minutes * 60,
                        signals.received == "SIGTERM",
                        signals.received == "SIGINT",
                    ]
                    stats, agreed = step(iterator, tf.constant(wanted, tf.float32))
                    loss, batch_tokens, batch_rows = (float(value) for value in stats.numpy())
                    micro += 1
                    losses.append(loss)
                    rows.append(batch_rows)
                    tokens += batch_tokens
                    if not np.isfinite(losses[-1]):
                        raise FloatingPointError(
                            f"Non-finite loss {losses[-1]} at micro-batch {micro}; the last good checkpoint is kept"
                        )
                    # The epoch's loss as Keras's fit reports it: the batches' losses weighted by their rows.
                    epoch_loss = float(np.average(losses, weights=rows)) if sum(rows) else float(np.mean(losses))
                    callbacks.on_train_batch_end(batch, {"loss": epoch_loss, "target_tokens": tokens})
                    requested = [name for name, count in zip(_REQUESTS, agreed.numpy(), strict=True) if count > 0]
                    boundary = checkpointer.at_update_boundary()
                    if boundary and any(name != "time_budget" for name in requested):
                        stopped_by = next(name for name in requested if name != "time_budget")
                        saved = checkpointer.save()
                        logging.warning("%s: stopped by %s with checkpoint %s", cluster.name, stopped_by, saved)
                        raise _Stop
                    if boundary and requested:
                        model.stop_training = True
                    if model.stop_training or (by_epochs and micro >= total_micro):
                        break
                logs = {"loss": epoch_loss, "target_tokens": tokens}
                if evaluate is not None:
                    logs.update(evaluate())
                callbacks.on_epoch_end(epoch, logs)
                for key, value in logs.items():
                    history.setdefault(key, []).append(float(value))
                if cluster.is_chief:
                    with epoch_writer.as_default(step=int(model.optimizer.iterations.numpy())):
                        for key in ("loss", "val_loss", "val_perplexity", "val_bleu"):
                            if key in logs:
                                tf.summary.scalar(f"epoch_{key}", logs[key])
                finished = model.stop_training or (by_epochs and micro >= total_micro)
            callbacks.on_train_end()
    except _Stop:
        pass
    except _LOST as error:
        raise ClusterError(
            f"{cluster.name}: lost contact with the other workers after micro-batch {micro} "
            f"({run_dir.first_line(error)}). A worker died, or stopped answering the coordination service's "
            f"heartbeats. The newest checkpoint is {chief_manager.latest_checkpoint}: run "
            "every worker's command again to resume from it"
        ) from None
    summary = {
        "model_dir": model_dir,
        "config": config.name,
        "strategy": "multi_worker",
        "task": [cluster.task_type, cluster.task_id],
        "replicas": replicas,
        "params": int(model.count_params()),
        "steps": int(model.optimizer.iterations.numpy()),
        "steps_per_epoch": steps_per_epoch,
        "train_seconds": round(time.perf_counter() - start, 1),
        "stats": dataclasses.asdict(data.stats),
        "history": history,
        "dev_bleu": monitor.last_bleu,
        "latest_checkpoint": chief_manager.latest_checkpoint,
        "stopped_by": stopped_by,
    }
    run_dir.save_json(os.path.join(work_dir, "train_summary.json"), summary)
    logging.info("%s done: %s", cluster.name, json.dumps({k: v for k, v in summary.items() if k != "history"}))
    return summary


class _Stop(Exception):
    """All workers agreed to stop on a signal, with a checkpoint."""


def _workers(strategy) -> int:
    spec = strategy.cluster_resolver.cluster_spec().as_dict() if strategy.cluster_resolver else {}
    return sum(len(tasks) for kind, tasks in spec.items() if kind in ("chief", "worker")) or 1


def _train_step(model: keras.Model, strategy: tf.distribute.Strategy, jit_compile: bool):
    """One micro-batch on every replica: ``([loss, target tokens, rows], stop requests)``, summed over replicas.

    The loss is the micro-batch's part of its update's token mean (times
    ``accumulate_steps``, as Keras averages accumulated gradients); the requests
    are each worker's wish to stop (:data:`_REQUESTS`), summed.
    """

    local = float(len(strategy.extended.worker_devices))  # replicas on this worker, which all send its wishes

    def replica_step(features, labels, weights, wanted):
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = model.loss(labels, logits, weights)
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))  # summed
        tokens = tf.reduce_sum(tf.cast(tf.not_equal(labels, 0), tf.float32))
        rows = tf.cast(tf.shape(labels)[0], tf.float32)
        return tf.stack([loss, tokens, rows]), wanted / local

    # As Keras's fit does: XLA compiles the replica's step only; next() stays outside, XLA has no IteratorGetNext.
    replica = tf.function(replica_step, jit_compile=True) if jit_compile else replica_step

    @tf.function
    def step(iterator, wanted):
        stats, agreed = strategy.run(replica, args=(*next(iterator), wanted))
        stats = strategy.reduce(tf.distribute.ReduceOp.SUM, stats, axis=None)  # an all-reduce: every worker
        return stats, strategy.reduce(tf.distribute.ReduceOp.SUM, agreed, axis=None)

    return step


def _evaluation(model: keras.Model, validation: tf.data.Dataset):
    """Validation on the whole dev set, by each worker on its own: ``{"val_loss", "val_perplexity"}``.

    ``val_loss`` is weighted as Keras weights it under ``fit`` on one device (each
    batch's token mean by its rows); ``val_perplexity`` is over the dev set's
    tokens, the same in every layout.
    """
    loss_fn = model.loss
    perplexity = TokenPerplexity()

    @tf.function
    def batch(features, labels):
        logits = model(features, training=False)
        perplexity.update_state(labels, logits)
        return loss_fn(labels, logits), tf.shape(labels)[0]

    def evaluate() -> dict[str, float]:
        perplexity.reset_state()
        total, rows = 0.0, 0
        for features, labels in validation:
            loss, count = batch(features, labels)
            total += float(loss) * int(count)
            rows += int(count)
        return {"val_loss": total / max(rows, 1), "val_perplexity": float(perplexity.result())}

    return evaluate

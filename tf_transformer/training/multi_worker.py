"""Training on several machines: ``MultiWorkerMirroredStrategy`` driven by a loop of our own.

Keras 3 ``fit`` fails under ``MultiWorkerMirroredStrategy``
(keras-team/keras#20585), so workers run this loop over a run prepared as
every layout prepares it (:mod:`~tf_transformer.training.preparation`): same model,
loss, optimizer, schedule, global batches and callbacks, and the same update:

* every worker builds the same global batches; a worker of ``M`` replicas
  feeds them ``M`` consecutive parts of each (``pipelines.replica_parts``), and
  the loss weights each token by ``1 / T`` for the ``T`` tokens of the whole
  update (``pipelines.update_weights``), so N machines × M GPUs make the update
  one device makes on the whole batch;
* one vocabulary, one run directory and one set of options, agreed before the
  first step (:mod:`~tf_transformer.training.cluster`);
* every decision that ends or pauses training is agreed: the step limit and
  the epochs are counted alike; a time budget or a signal seen by one worker
  (:class:`~tf_transformer.training.callbacks.StopRequests`) travels with the
  next step's collective, so all stop after the same step and write the same
  checkpoint;
* a worker that dies or stops answering is noticed by the heartbeats of
  TensorFlow's coordination service (within seconds), which abort the
  others' collectives: they stop with an error saying how to resume. No
  per-collective timeout: TF keeps that for debugging (a thread per collective).

All workers save (saving runs collectives): the chief into ``model_dir``, the
others into ``model_dir/.worker-<i>``, which only they read. What differs from
``fit`` is only this loop: the step that carries the stop requests, the
validation pass, and the epoch's logs made by hand.
"""

from __future__ import annotations

import json
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

import pipelines
from tf_transformer.files import first_line
from tf_transformer.training.callbacks import Preempted
from tf_transformer.training.cluster import LOST, ClusterError
from tf_transformer.training.metrics import TokenPerplexity
from tf_transformer.training.preparation import PreparedRun, finish


def replica_dataset_fn(stream: tf.data.Dataset):
    """``dataset_fn`` for ``distribute_datasets_from_function``: this pipeline's parts of each global batch."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        parts = pipelines.replica_parts(
            context.input_pipeline_id, context.num_input_pipelines, context.num_replicas_in_sync
        )
        return stream.apply(parts)

    return dataset_fn


def train_multi_worker(prepared: PreparedRun) -> dict:
    """Trains a prepared run as one worker of its strategy; returns this worker's summary."""
    cluster, model, strategy = prepared.place.cluster, prepared.model, prepared.strategy
    distributed = strategy.distribute_datasets_from_function(replica_dataset_fn(prepared.stream()))
    step = _train_step(model, strategy, bool(prepared.options.jit_compile))
    callbacks = keras.callbacks.CallbackList(prepared.callbacks.all, model=model)
    requests = (
        prepared.callbacks.stop_requests
    )  # only records this worker's wishes: the step's collective agrees on them

    def agree() -> None:
        """Between steps (validation, the epoch's end): every worker's wishes summed, for every worker alike."""
        requests.agreed = [count > 0 for count in cluster.sum(requests.wanted())]

    evaluate = (
        _evaluation(model, prepared.inputs.validation, agree, requests)
        if prepared.inputs.validation is not None
        else None
    )

    steps_per_epoch, total_micro = prepared.inputs.steps_per_epoch, prepared.inputs.total_micro
    start = time.perf_counter()
    history: dict[str, list[float]] = {}
    stopped_by = None
    micro = prepared.done_micro
    iterator = iter(distributed)
    model.stop_training = False
    finished = prepared.finished()
    try:
        with requests:
            if not finished:
                callbacks.on_train_begin()
            while not finished:
                epoch, offset = divmod(micro, steps_per_epoch)
                callbacks.on_epoch_begin(epoch)
                losses, rows, tokens = [], [], 0.0
                for batch in range(offset, steps_per_epoch):
                    callbacks.on_train_batch_begin(batch)
                    stats, agreed = step(iterator, tf.constant(requests.wanted(), tf.float32))
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
                    requests.agreed = [count > 0 for count in agreed.numpy()]
                    callbacks.on_train_batch_end(batch, {"loss": epoch_loss, "target_tokens": tokens})
                    if model.stop_training or (prepared.by_epochs and micro >= total_micro):
                        break
                logs = {"loss": epoch_loss, "target_tokens": tokens}
                if evaluate is not None:
                    logs.update(evaluate())  # a signal meanwhile stops it (StopRequests.on_test_batch_end)
                agree()  # a signal since the last step stops before the epoch's dev BLEU
                callbacks.on_epoch_end(epoch, logs)
                for key, value in logs.items():
                    history.setdefault(key, []).append(float(value))
                finished = model.stop_training or (prepared.by_epochs and micro >= total_micro)
            callbacks.on_train_end()
    except Preempted as stop:
        stopped_by = stop.signal_name
        logging.warning("%s: stopped by %s with checkpoint %s", cluster.name, stop.signal_name, stop.checkpoint)
    except LOST as error:
        raise ClusterError(
            f"{cluster.name}: lost contact with the other workers after micro-batch {micro} "
            f"({first_line(error)}). A worker died, or stopped answering the coordination service's "
            f"heartbeats. The newest checkpoint is {prepared.state.chief_manager.latest_checkpoint}: run "
            "every worker's command again to resume from it"
        ) from None
    summary = finish(
        prepared,
        time.perf_counter() - start,
        history,
        stopped_by,
        strategy="multi_worker",
        task=[cluster.task_type, cluster.task_id],
        replicas=strategy.num_replicas_in_sync,
    )
    logging.info("%s done: %s", cluster.name, json.dumps({k: v for k, v in summary.items() if k != "history"}))
    return summary


def _train_step(model: keras.Model, strategy: tf.distribute.Strategy, jit_compile: bool):
    """One micro-batch on every replica: ``([loss, target tokens, rows], stop requests)``, summed over replicas.

    The loss is the micro-batch's part of its update's token mean (times
    ``accumulate_steps``, as Keras averages accumulated gradients); the requests
    are each worker's wishes to stop (``StopRequests.REASONS``), summed.
    """

    local = float(len(strategy.extended.worker_devices))  # replicas on this worker, which all send its wishes

    def replica_step(features, labels, weights, wanted):
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = model.loss(labels, logits, weights)
            scaled = model.optimizer.scale_loss(loss)  # mixed_float16's loss scale, else the loss
        gradients = tape.gradient(scaled, model.trainable_variables)
        # The global update (training/update.py): summed over every replica, accumulated, one verdict.
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
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


def _evaluation(model: keras.Model, validation: tf.data.Dataset, agree, requests):
    """Validation on the whole dev set, by each worker on its own: ``{"val_loss", "val_perplexity"}``.

    ``val_loss`` is weighted as Keras weights it under ``fit`` on one device (each
    batch's token mean by its rows); ``val_perplexity`` is over the dev set's
    tokens, the same in every layout. After each batch the workers agree
    (``agree``, a small collective) on the wishes to stop, and ``requests``
    (``StopRequests``) acts on a signal as under ``fit``: every worker
    validates the same batches, so all stop at the same one.
    """
    loss_fn = model.loss
    perplexity = TokenPerplexity(allowed=loss_fn.softmax_tokens())  # as compile_model's

    @tf.function
    def batch(features, labels):
        logits = model(features, training=False)
        perplexity.update_state(labels, logits)
        return loss_fn(labels, logits), tf.shape(labels)[0]

    def evaluate() -> dict[str, float]:
        perplexity.reset_state()
        total, rows = 0.0, 0
        for index, (features, labels) in enumerate(validation):
            loss, count = batch(features, labels)
            total += float(loss) * int(count)
            rows += int(count)
            agree()
            requests.on_test_batch_end(index)
        return {"val_loss": total / max(rows, 1), "val_perplexity": float(perplexity.result())}

    return evaluate

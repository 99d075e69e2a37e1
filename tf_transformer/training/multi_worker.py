"""Multi-worker training with ``MultiWorkerMirroredStrategy`` and a custom loop.

Keras 3 ``fit`` fails under ``MultiWorkerMirroredStrategy``
(keras-team/keras#20585), so workers run this loop instead. It uses the same
model, loss, optimizer, schedule and data pipeline as ``fit``; every worker
builds the same deterministic global batches and keeps its contiguous slice,
and the loss is normalized by the *global* number of target tokens, so N
workers make exactly the update one process makes on the whole batch.

The chief (worker 0) writes checkpoints and TensorBoard logs to ``model_dir``;
other workers write their copies under ``model_dir/.worker-<i>`` (all workers
must save, as collective ops run during saving).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import tensorflow as tf
from absl import logging

import pipelines
from configs import TransformerConfig
from tf_transformer import run_dir
from tf_transformer.model import build_transformer
from tf_transformer.training.losses import LabelSmoothedCrossEntropy
from tf_transformer.training.optimizers import current_learning_rate
from tf_transformer.training.resume import training_checkpoint
from tf_transformer.training.schedules import paper_optimizer


def _task(strategy) -> tuple[str | None, int]:
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return None, 0
    return resolver.task_type, int(resolver.task_id or 0)


def train_multi_worker(config: TransformerConfig, options, model_dir: str, strategy) -> dict:
    """Trains with ``strategy`` (a MultiWorkerMirroredStrategy) for ``options.train_steps`` steps."""
    if options.accumulate_steps > 1:
        raise ValueError("--accumulate_steps is not supported with --strategy multi_worker")
    if options.precision == "mixed_float16":
        raise ValueError("--precision mixed_float16 needs loss scaling; use mixed_bfloat16 with multi_worker")
    task_type, task_id = _task(strategy)
    is_chief = task_type in (None, "chief") or (task_type == "worker" and task_id == 0)
    work_dir = model_dir if is_chief else os.path.join(model_dir, f".worker-{task_id}")
    os.makedirs(work_dir, exist_ok=True)

    corpus = pipelines.find_split(options.data, options.train_split, options.src, options.tgt)
    tokenizer = run_dir.make_vocabulary(  # deterministic: identical on every worker
        work_dir, corpus, options.vocab_size or config.vocab_size, options.vocab_model_type, options.seed
    )
    config = config.replace(vocab_size=tokenizer.vocab_size)
    run_dir.save_run(work_dir, config, dataclasses.asdict(options))
    replicas = strategy.num_replicas_in_sync
    data = pipelines.training_dataset(
        corpus,
        tokenizer,
        tokens_per_batch=options.tokens or config.tokens_per_batch,
        max_length=options.max_length or config.max_sequence_length,
        num_replicas=replicas,
        seed=options.seed,
        deterministic=True,
        repeat=True,
        cache_dir=os.path.join(work_dir, "data_cache"),
    )
    steps_per_epoch = options.steps_per_epoch or data.batches_per_epoch
    total_steps = options.train_steps or (options.epochs or 0) * steps_per_epoch or config.train_steps

    with strategy.scope():
        model = build_transformer(config)
        optimizer = paper_optimizer(config.d_model, config.warmup_steps, config.learning_rate_scale)
        optimizer.build(model.trainable_variables)
    smoothing = LabelSmoothedCrossEntropy(config.label_smoothing)
    checkpoint = training_checkpoint(model, optimizer)
    chief_checkpoints = os.path.join(model_dir, "checkpoints")
    manager = tf.train.CheckpointManager(
        checkpoint, os.path.join(work_dir, "checkpoints"), max_to_keep=options.keep_checkpoints
    )
    latest = tf.train.latest_checkpoint(chief_checkpoints)
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        logging.info("Resumed from %s", latest)
    done = int(optimizer.iterations.numpy())

    def dataset_fn(context: tf.distribute.InputContext):
        pipeline, count = context.input_pipeline_id, context.num_input_pipelines

        def shard(features, labels):
            rows = tf.shape(labels)[0] // count  # batch sizes are multiples of the replica count

            def take(tensor):  # this worker's contiguous slice of the global batch
                return tensor[pipeline * rows : (pipeline + 1) * rows]

            return {key: take(value) for key, value in features.items()}, take(labels)

        return data.starting_at(done).map(shard)

    distributed = strategy.distribute_datasets_from_function(dataset_fn)

    def replica_step(features, labels):
        context = tf.distribute.get_replica_context()
        mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
        tokens = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(mask))
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            local_mean = smoothing(labels, logits)  # mean over this replica's tokens
            loss = local_mean * tf.reduce_sum(mask) / tf.maximum(tokens, 1.0)  # share of the global mean
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))  # summed over replicas
        return loss

    @tf.function
    def train_step(iterator):
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    writer = tf.summary.create_file_writer(os.path.join(work_dir, "logs", "train"))
    iterator = iter(distributed)
    start = time.perf_counter()
    losses = []
    step = done
    while step < total_steps:
        loss = float(train_step(iterator))
        step = int(optimizer.iterations.numpy())
        losses.append(loss)
        if not math.isfinite(loss):
            raise FloatingPointError(f"Non-finite loss {loss} at step {step}; the last good checkpoint is kept")
        if is_chief:
            with writer.as_default(step=step):
                tf.summary.scalar("loss", loss)
                tf.summary.scalar("learning_rate", current_learning_rate(optimizer))
        if options.checkpoint_every and step % options.checkpoint_every == 0 or step == total_steps:
            manager.save(checkpoint_number=step)
    summary = {
        "model_dir": model_dir,
        "config": config.name,
        "strategy": "multi_worker",
        "task": [task_type, task_id],
        "replicas": replicas,
        "params": int(model.count_params()),
        "steps": step,
        "train_seconds": round(time.perf_counter() - start, 1),
        "history": {"loss": losses},
        "latest_checkpoint": manager.latest_checkpoint,
    }
    run_dir.save_json(os.path.join(work_dir, "train_summary.json"), summary)
    logging.info("worker %s done: %s", task_id, json.dumps({k: v for k, v in summary.items() if k != "history"}))
    return summary

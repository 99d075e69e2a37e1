"""The training driver behind ``tft-train``: data, vocabulary, model, ``fit``, checkpoints, resume.

The model directory holds everything later commands need: ``config.json`` (the
model config and the run options), ``sp.model`` (the shared vocabulary),
``checkpoints/`` (model and optimizer, the last K), ``logs/`` (TensorBoard) and
``data_cache/`` (tokenized data).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

import pipelines
from configs import TransformerConfig
from tf_transformer.model import build_transformer
from tf_transformer.training.callbacks import (
    StepCheckpoint,
    StopAfterMinutes,
    StopAtStep,
    TargetTokens,
    TrainingMonitor,
)
from tf_transformer.training.losses import LabelSmoothedCrossEntropy, TokenAccuracy, TokenPerplexity
from tf_transformer.training.schedules import paper_optimizer
from tf_transformer.training.strategy import default_jit_compile, make_strategy, set_precision
from tf_transformer.translator import Translator


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to train (the model itself is a :class:`configs.TransformerConfig`).

    ``train_steps`` counts optimizer updates; ``steps_per_epoch`` counts
    micro-batches (one data pass by default). ``tokens`` is the global budget per
    side; ``None`` takes the preset's.
    """

    data: str
    src: str = "en"
    tgt: str = "de"
    train_split: str = "train"
    dev_split: str | None = "val"
    epochs: int | None = None
    train_steps: int | None = None
    steps_per_epoch: int | None = None
    checkpoint_every: int | None = 1000
    keep_checkpoints: int = 10
    tokens: int | None = None
    max_length: int | None = None
    precision: str = "float32"
    strategy: str = "auto"
    jit_compile: bool | None = None
    accumulate_steps: int = 1
    seed: int = 1
    vocab_size: int | None = None
    vocab_model_type: str = "bpe"
    dev_bleu_sentences: int = 100
    log_every: int = 50
    max_minutes: float | None = None
    budget_start: float | None = None  # time.perf_counter() at which max_minutes starts (default: the first step)
    verbose: int | str = "auto"


def _save_json(path: str, value) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def load_run(model_dir: str) -> tuple[TransformerConfig, dict]:
    """The model config and run options stored in ``model_dir/config.json``."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {model_dir!r} a model directory written by tft-train?")
    with open(path) as handle:
        stored = json.load(handle)
    return TransformerConfig.from_dict(stored["model"]), stored["run"]


def _prepare_model_dir(model_dir: str, config: TransformerConfig, options: RunOptions) -> TransformerConfig:
    """Creates the directory, or checks a resumed run uses the same model config."""
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, "config.json")
    if os.path.exists(path):
        stored, _ = load_run(model_dir)
        differing = [
            f.name
            for f in dataclasses.fields(config)
            if f.name != "vocab_size" and getattr(config, f.name) != getattr(stored, f.name)
        ]
        if differing:
            raise ValueError(
                f"{model_dir} holds a run with a different model config (fields: {', '.join(differing)}); "
                "use a new --model_dir or the original --config"
            )
    return config


def _vocabulary(model_dir: str, corpus, config: TransformerConfig, options: RunOptions) -> pipelines.Tokenizer:
    path = os.path.join(model_dir, "sp.model")
    if not os.path.exists(path):
        size = options.vocab_size or config.vocab_size
        logging.info("Training a shared %s vocabulary of %d pieces on %s", options.vocab_model_type, size, corpus.paths)
        pipelines.train_sentencepiece(
            corpus.pairs(), path, vocab_size=size, model_type=options.vocab_model_type, seed=options.seed
        )
    return pipelines.Tokenizer(path)


def compile_model(model, config: TransformerConfig, accumulate_steps: int = 1, jit_compile: bool = False):
    """Compiles with the paper's recipe: label smoothing, Adam 0.9/0.98/1e-9, eq. 3."""
    model.compile(
        optimizer=paper_optimizer(config.d_model, config.warmup_steps, config.learning_rate_scale, accumulate_steps),
        loss=LabelSmoothedCrossEntropy(config.label_smoothing),
        metrics=[TokenAccuracy(), TokenPerplexity(), TargetTokens()],
        jit_compile=jit_compile,
    )
    return model


def translate_fn(model, tokenizer, extra_length: int = 50, batch_tokens: int = 4096):
    """A function translating a list of strings greedily (for monitoring).

    Greedy is the cached beam search with one beam (equal to re-running the
    decoder over the prefix, tested), so dev BLEU each epoch costs seconds.
    """
    translator = Translator(model, tokenizer, beam_size=1, extra_length=extra_length)
    decode = tf.function(lambda ids: translator.search(ids)[0][:, 0], reduce_retracing=True)

    def translate(sources: list[str]) -> list[str]:
        batches = list(pipelines.evaluation_dataset(sources, tokenizer, tokens_per_batch=batch_tokens))
        outputs = [tokenizer.detokenize(decode(b["inputs"])).numpy() for b in batches]
        restored = pipelines.restore_order([b["index"].numpy() for b in batches], outputs, len(sources))
        return [text.decode("utf-8") for text in restored]

    return translate


def train(config: TransformerConfig, options: RunOptions, model_dir: str) -> dict:
    """Trains (or resumes) a model in ``model_dir``; returns a summary dict."""
    # First: MultiWorkerMirroredStrategy must configure collectives before TensorFlow starts.
    strategy = make_strategy(options.strategy)
    config = _prepare_model_dir(model_dir, config, options)
    keras.utils.set_random_seed(options.seed)  # initialization and dropout; data order uses the seed too
    set_precision(options.precision)
    if options.strategy == "multi_worker":
        from tf_transformer.training.multi_worker import train_multi_worker

        return train_multi_worker(config, options, model_dir, strategy)
    jit_compile = default_jit_compile() if options.jit_compile is None else options.jit_compile
    accumulate = max(1, options.accumulate_steps)

    corpus = pipelines.find_split(options.data, options.train_split, options.src, options.tgt)
    tokenizer = _vocabulary(model_dir, corpus, config, options)
    config = config.replace(vocab_size=tokenizer.vocab_size)
    _save_json(os.path.join(model_dir, "config.json"), {"model": config.to_dict(), "run": dataclasses.asdict(options)})
    tokens = options.tokens or config.tokens_per_batch
    max_length = options.max_length or config.max_sequence_length
    data = pipelines.training_dataset(
        corpus,
        tokenizer,
        tokens_per_batch=tokens,
        max_length=max_length,
        num_replicas=strategy.num_replicas_in_sync,
        pad_to_bucket_boundary=jit_compile,
        seed=options.seed,
        deterministic=True,
        repeat=True,
        cache_dir=os.path.join(model_dir, "data_cache"),
    )
    steps_per_epoch = options.steps_per_epoch or data.batches_per_epoch
    if options.train_steps:
        total_micro = options.train_steps * accumulate
    elif options.epochs:
        total_micro = options.epochs * steps_per_epoch
    else:
        total_micro = config.train_steps * accumulate

    validation = None
    dev_sources, dev_references = [], []
    if options.dev_split:
        dev = pipelines.find_split(options.data, options.dev_split, options.src, options.tgt)
        validation = pipelines.training_dataset(
            dev,
            tokenizer,
            tokens_per_batch=tokens,
            max_length=max_length,
            num_replicas=strategy.num_replicas_in_sync,
            pad_to_bucket_boundary=jit_compile,
            shuffle=False,
            cache_dir=os.path.join(model_dir, "data_cache"),
            name=options.dev_split,
        ).dataset
        pairs = list(dev.pairs())[: options.dev_bleu_sentences]
        dev_sources, dev_references = [p[0] for p in pairs], [p[1] for p in pairs]

    with strategy.scope():
        model = build_transformer(config)
        compile_model(model, config, accumulate, jit_compile)
        model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(
        checkpoint, os.path.join(model_dir, "checkpoints"), max_to_keep=options.keep_checkpoints
    )
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        logging.info("Resumed from %s", manager.latest_checkpoint)
    done_micro = int(model.optimizer._iterations.numpy())
    log_dir = os.path.join(model_dir, "logs")
    monitor = TrainingMonitor(
        log_dir,
        every_steps=options.log_every,
        dev_sources=dev_sources,
        dev_references=dev_references,
        translate=translate_fn(model, tokenizer, config.extra_decode_length) if dev_sources else None,
    )
    callbacks = [
        keras.callbacks.TerminateOnNaN(),
        StepCheckpoint(manager, options.checkpoint_every, accumulate),
        StopAtStep(math.ceil(total_micro / accumulate)),
        monitor,
        keras.callbacks.TensorBoard(log_dir, update_freq="epoch"),
    ]
    if options.max_minutes:
        callbacks.insert(2, StopAfterMinutes(options.max_minutes, options.budget_start))
    start = time.perf_counter()
    history = {}
    if done_micro < total_micro:
        # Resume where the checkpoint was written: skip the micro-batches already
        # trained on (the data order is deterministic for a seed) in one fit call,
        # so the data is iterated once, exactly as in an uninterrupted run. After a
        # mid-epoch resume, epoch boundaries (validation, BLEU) shift by the part of
        # the epoch already done; the step count and the batches are unchanged.
        initial_epoch = done_micro // steps_per_epoch
        epochs = initial_epoch + math.ceil((total_micro - done_micro) / steps_per_epoch)
        result = model.fit(
            data.dataset.skip(done_micro),
            validation_data=validation,
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks,
            verbose=options.verbose,
        )
        history = {key: [float(v) for v in values] for key, values in result.history.items()}
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
    }
    _save_json(os.path.join(model_dir, "train_summary.json"), summary)
    return summary


def restore_model(model_dir: str, checkpoint_path: str | None = None):
    """Rebuilds the model of ``model_dir`` and loads a checkpoint (the latest by default)."""
    config, _ = load_run(model_dir)
    model = build_transformer(config)
    path = checkpoint_path or tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    if path is None:
        raise FileNotFoundError(f"No checkpoint in {os.path.join(model_dir, 'checkpoints')}")
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    return model, config


def checkpoint_weights(model, path: str) -> list[np.ndarray]:
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    return [np.array(w) for w in model.get_weights()]

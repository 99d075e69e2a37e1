"""What both training loops share: the run directory, the vocabulary, the data, the compiled model.

``fit`` (:mod:`~tf_transformer.training.trainer`) and the multi-worker loop
(:mod:`~tf_transformer.training.multi_worker`) must train on the same batches
with the same recipe, so each piece that decides them is built here once.
"""

from __future__ import annotations

import dataclasses
import math
import os

import keras
import tensorflow as tf

import pipelines
from configs import RunOptions, TransformerConfig
from tf_transformer import run_dir
from tf_transformer.attention_maps import AttentionMaps, attention_maps, hypothesis_length
from tf_transformer.constants import EOS_ID
from tf_transformer.inference import IncrementalDecoder, greedy_search
from tf_transformer.training.callbacks import TargetTokens
from tf_transformer.training.losses import LabelSmoothedCrossEntropy, TokenAccuracy, TokenPerplexity
from tf_transformer.training.schedules import paper_optimizer


class OptionError(ValueError):
    """Run options that cannot work together (or not here); the message names them and says what to do."""


def check_model_dir(model_dir: str, config: TransformerConfig) -> None:
    """Creates the directory, or checks a resumed run uses the same model config."""
    tf.io.gfile.makedirs(model_dir)
    if tf.io.gfile.exists(os.path.join(model_dir, run_dir.CONFIG_FILE)):
        stored, _ = run_dir.load_run(model_dir)
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


def check_jit_compile(strategy: tf.distribute.Strategy, jit_compile: bool) -> None:
    """XLA over several logical CPU devices fails deep inside TensorFlow: refuse it at the start."""
    cpu_replicas = strategy.num_replicas_in_sync > 1 and not tf.config.list_logical_devices("GPU")
    if jit_compile and cpu_replicas and isinstance(strategy, tf.distribute.MirroredStrategy):
        raise OptionError(
            f"--jit_compile with --strategy mirrored over {strategy.num_replicas_in_sync} logical CPU devices: "
            "TensorFlow's XLA cannot compile a step mirrored over CPU devices. On CPUs use --nojit_compile "
            "(the default there); on GPUs --jit_compile is the recommended setting"
        )


def compile_model(model, config: TransformerConfig, accumulate_steps: int = 1, jit_compile: bool = False):
    """Compiles with the paper's recipe: label smoothing, Adam 0.9/0.98/1e-9, eq. 3."""
    model.compile(
        optimizer=paper_optimizer(config.d_model, config.warmup_steps, config.learning_rate_scale, accumulate_steps),
        loss=LabelSmoothedCrossEntropy(config.label_smoothing, accumulate_steps=accumulate_steps),
        metrics=[TokenAccuracy(), TokenPerplexity(), TargetTokens()],
        jit_compile=jit_compile,
    )
    return model


def _greedy(model, extra_length: int):
    """``ids int32[batch, src_len] → int32[batch, out_len]`` by greedy search over the decoding cache."""
    decoding = IncrementalDecoder(model)
    return tf.function(
        lambda ids: greedy_search(model, ids, extra_length=extra_length, decoding=decoding), reduce_retracing=True
    )


def translate_fn(model, tokenizer, extra_length: int = 50, batch_tokens: int = 4096):
    """A function translating a list of strings by greedy search (dev BLEU during training).

    Greedy search over the decoding cache, so dev BLEU each epoch costs seconds.
    """
    decode = _greedy(model, extra_length)

    def translate(sources: list[str]) -> list[str]:
        batches = list(pipelines.evaluation_dataset(sources, tokenizer, tokens_per_batch=batch_tokens))
        outputs = [tokenizer.detokenize(decode(b["inputs"])).numpy() for b in batches]
        restored = pipelines.restore_order([b["index"].numpy() for b in batches], outputs, len(sources))
        return [text.decode("utf-8") for text in restored]

    return translate


def attention_fn(model, tokenizer, extra_length: int = 50):
    """A function from a list of strings to their :class:`~tf_transformer.attention_maps.AttentionMaps`.

    Each sentence is translated greedily, as dev BLEU is, then the model runs
    teacher-forced over its translation and keeps every layer's attention (the
    TensorBoard images of :class:`~tf_transformer.training.callbacks.TrainingMonitor`).
    """
    decode = _greedy(model, extra_length)
    processor = tokenizer.python_processor()  # the ids of the graph's tokenizer, and their pieces

    def maps(sources: list[str]) -> list[AttentionMaps]:
        found = []
        for source in sources:
            ids = [*processor.encode(source.strip()), EOS_ID]
            output = decode(tf.constant([ids], tf.int32))[0].numpy()
            target = output[: hypothesis_length(output)]
            found.append(attention_maps(model, ids, target, processor.id_to_piece))
        return found

    return maps


def training_data(
    corpus, tokenizer, config: TransformerConfig, options: RunOptions, replicas: int, jit_compile: bool, model_dir: str
) -> pipelines.TrainingData:
    """The run's global batches: the same for 1, 2, 4 or 8 replicas where the budget allows (``make_buckets``)."""
    return pipelines.training_dataset(
        corpus,
        tokenizer,
        tokens_per_batch=options.tokens or config.tokens_per_batch,
        max_length=options.max_length or config.max_sequence_length,
        num_replicas=replicas,
        pad_to_bucket_boundary=jit_compile,
        seed=options.seed,
        deterministic=True,
        repeat=True,
        cache_dir=run_dir.data_cache_dir(model_dir),
    )


def dev_data(tokenizer, config: TransformerConfig, options: RunOptions, replicas: int, jit_compile: bool, model_dir):
    """``(validation batches or None, dev sources, dev references)`` for validation loss and dev BLEU."""
    if not options.dev_split:
        return None, [], []
    dev = pipelines.find_split(options.data, options.dev_split, options.src, options.tgt)
    validation = pipelines.training_dataset(
        dev,
        tokenizer,
        tokens_per_batch=options.tokens or config.tokens_per_batch,
        max_length=options.max_length or config.max_sequence_length,
        num_replicas=replicas,
        pad_to_bucket_boundary=jit_compile,
        shuffle=False,
        cache_dir=run_dir.data_cache_dir(model_dir),
        name=options.dev_split,
    ).dataset
    pairs = list(dev.pairs())[: options.dev_bleu_sentences]
    return validation, [p[0] for p in pairs], [p[1] for p in pairs]


def total_micro_batches(config: TransformerConfig, options: RunOptions, steps_per_epoch: int) -> int:
    """Micro-batches the run trains on: ``--train_steps`` updates, else ``--epochs``, else the preset's steps."""
    accumulate = max(1, options.accumulate_steps)
    if options.train_steps:
        return options.train_steps * accumulate
    if options.epochs:
        return options.epochs * steps_per_epoch
    return config.train_steps * accumulate


def update_count(total_micro: int, accumulate_steps: int) -> int:
    return math.ceil(total_micro / max(1, accumulate_steps))


def initialize_from(model: keras.Model, source_dir: str, checkpoint: str) -> None:
    """Copies another run's weights (``--init_from``); the optimizer and schedule start at step 0.

    Through a model of its own: the compiled model's checkpoint would also restore the optimizer.
    """
    source, _ = run_dir.restore_model(source_dir, checkpoint)
    for weight, value in zip(model.weights, source.weights, strict=True):
        weight.assign(value)


def weighted_stream(data: pipelines.TrainingData, done_micro: int, accumulate_steps: int) -> tf.data.Dataset:
    """The stream from micro-batch ``done_micro`` on, each batch weighted by its update's tokens.

    The groups of ``accumulate_steps`` micro-batches whose tokens make one
    update's weights start at update boundaries, even when a run resumes
    within an accumulation (a time budget may stop it there).
    """
    accumulate = max(1, accumulate_steps)
    within = done_micro % accumulate
    stream = data.starting_at(done_micro - within).apply(pipelines.update_weights(accumulate))
    return stream.skip(within) if within else stream

"""Ours: the ``small``/``base`` preset trained by Keras ``fit`` with the paper's loss and optimizer
(float32 and mixed_bfloat16); decoding through the exported SavedModel's ``translate_ids``
signature (exported with min = max output length), float32 and bfloat16 weights
(``tft-export --precision bfloat16``)."""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import pipelines
from benchmarks.peers import DecodeRun, DecodingWorkload, Training
from benchmarks.peers.workload import FLAGS, concurrently, keras_fit_runner, one_after_another
from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.precision import inference_copy
from tf_transformer.exporting.saved_model import export_translator
from tf_transformer.flops import training_flops
from tf_transformer.inference.translator import Translator
from tf_transformer.training.trainer import compile_model


def train_runners(size: str) -> dict[str, Training]:
    return {f"ours_{precision}": trainer(size, precision) for precision in ("float32", "mixed_bfloat16")}


def decode_runners(size: str, workload: DecodingWorkload) -> dict[str, DecodeRun]:
    """float32 and bfloat16 exports; with ``--workers`` N also an N-stream export on each batch's parts."""
    runners = {
        f"ours_{dtype}": decoder(size, dtype, workload.batches, workload.tokenizer_path, workload.work)
        for dtype in ("float32", "bfloat16")
    }
    if FLAGS.workers > 1:  # our other way of using that many threads: each batch in parts, one loop each
        path = export(size, "float32", workload.tokenizer_path, workload.work, batch_parts=FLAGS.workers)
        runners[f"ours_float32_parts{FLAGS.workers}"] = one_after_another(runner(path, workload.batches))
    return runners


def save_decoder(size: str, workload: DecodingWorkload) -> str:
    """The float32 export with a loop for each of ``--batch_parts``."""
    return export(size, "float32", workload.tokenizer_path, workload.work)


def load_decoder(path: str, batches: list[np.ndarray]):
    return runner(path, batches)


def trainer(size: str, precision: str) -> Training:
    """Our preset trained by Keras ``fit`` with the paper's loss and optimizer, under ``precision``."""
    keras.config.set_dtype_policy(precision)
    try:
        config = get_config(size, vocab_size=FLAGS.vocab_size)
        model = compile_model(build_transformer(config), config)
        run = keras_fit_runner(model)
    finally:
        keras.config.set_dtype_policy("float32")
    figures = {
        "flops_per_step": training_flops(config, FLAGS.train_batch, FLAGS.src_len, FLAGS.tgt_len),
        "peak_key": "bfloat16" if "bfloat16" in precision else "float32",
        "params": int(model.count_params()),
    }
    return Training(run, figures)


def export(size: str, dtype: str, tokenizer_path: str, work: str, batch_parts: int | None = None) -> str:
    """Our ``size`` preset (random weights) exported for decoding with a fixed output length; returns its path.

    ``dtype`` as ``tft-export --dtype``: bfloat16 stores the weights in bfloat16.
    The export splits each batch into ``batch_parts`` equal parts (``tft-export --batch_parts``; default the flag's).
    """
    config = get_config(size, vocab_size=FLAGS.vocab_size)
    model = build_transformer(config)
    if dtype != "float32":
        model = inference_copy(model, dtype)
    options = DecodeOptions(
        beam_size=FLAGS.beam,
        min_length=FLAGS.output_tokens,
        max_output_length=FLAGS.output_tokens,
        batch_parts=FLAGS.batch_parts if batch_parts is None else batch_parts,
    )
    translator = Translator(model, pipelines.Tokenizer(tokenizer_path), options)
    name = f"ours_{size}_{dtype}" + (f"_parts{batch_parts}" if batch_parts else "")
    return export_translator(translator, tokenizer_path, os.path.join(work, name, "1"))


def decoder(size: str, dtype: str, batches: list[np.ndarray], tokenizer_path: str, work: str) -> DecodeRun:
    """``run(group)`` decodes ``batches[i]`` for each ``i`` of ``group`` through :func:`export`'s SavedModel.

    As a server would: with ``--workers`` N, the group's batches are N concurrent
    calls of the signature (TensorFlow runs each on its own inter-op thread).
    """
    return concurrently(runner(export(size, dtype, tokenizer_path, work), batches))


def runner(path: str, batches: list[np.ndarray]):
    """``run(i)``: the SavedModel at ``path`` decodes ``batches[i]`` (``translate_ids``, fixed output length)."""
    import tensorflow_text  # noqa: F401  registers the SentencePiece ops the export uses

    translate = tf.saved_model.load(path).signatures["translate_ids"]

    def run(i):
        outputs = translate(inputs=tf.constant(batches[i]))["ids"].numpy()
        assert outputs.shape[1] == FLAGS.output_tokens, outputs.shape

    return run

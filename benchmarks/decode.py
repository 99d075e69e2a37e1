"""Decoding speed benchmark (not a test): beam 4, batch 32, newstest2013 sources.

    python -m benchmarks.decode --data ../shared/data/newstest/newstest2013.en --config small --config base

Untrained weights, so every run does the same work: EOS is forbidden until a
fixed output length (``--output_tokens``). Sources are the first ``--sentences``
lines, tokenized with a SentencePiece model trained on them. Reports sentences/s
and target tokens/s for cached decoding, and for re-running the decoder over the
prefix at every step (uncached: the tests' reference search), on a subset. The
last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import tensorflow as tf
from absl import app, flags

import pipelines
from benchmarks.common import machine, source_batches, timed
from configs import get_config
from tests.decoding.reference import reference_beam_search
from tf_transformer import build_transformer
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.inference.translator import Translator

FLAGS = flags.FLAGS
flags.DEFINE_string("data", "../shared/data/newstest/newstest2013.en", "Source sentences, one per line.")
flags.DEFINE_multi_string("config", ["small", "base"], "Presets to measure.")
flags.DEFINE_integer("sentences", 512, "Source sentences decoded (cached).")
flags.DEFINE_integer("uncached_sentences", 64, "Source sentences decoded without the cache.")
flags.DEFINE_integer("batch", 32, "Sentences per batch.")
flags.DEFINE_integer("beam", 4, "Beam size.")
flags.DEFINE_integer("output_tokens", 40, "Forced output length (EOS included).")
flags.DEFINE_integer("vocab_size", 8000, "SentencePiece vocabulary size.")


def main(argv):
    del argv
    if not os.path.exists(FLAGS.data):
        raise app.UsageError(f"--data {FLAGS.data}: not found (real corpora live in ../shared/data)")
    lines = [line.strip() for line in pipelines.read_lines(FLAGS.data)][: FLAGS.sentences]
    with tempfile.TemporaryDirectory() as work:
        model_path = pipelines.train_sentencepiece(
            ((line, line) for line in lines), os.path.join(work, "sp.model"), vocab_size=FLAGS.vocab_size
        )
        tokenizer = pipelines.Tokenizer(model_path)
    inputs = source_batches(tokenizer, lines, FLAGS.batch)
    few = inputs[: max(1, FLAGS.uncached_sentences // FLAGS.batch)]
    results = []
    for name in FLAGS.config:
        config = get_config(name, vocab_size=tokenizer.vocab_size)
        model = build_transformer(config)
        translator = Translator(model, tokenizer, DecodeOptions(beam_size=FLAGS.beam)).with_options(
            min_length=FLAGS.output_tokens, max_output_length=FLAGS.output_tokens
        )
        cached = tf.function(lambda x, t=translator: t.search(x)[0], reduce_retracing=True)
        uncached = tf.function(lambda x, t=translator: reference_beam_search(t, x)[0], reduce_retracing=True)
        seconds = timed(lambda x, f=cached: f(x).numpy(), inputs)
        seconds_uncached = timed(lambda x, f=uncached: f(x).numpy(), few)
        sentences = sum(int(b.shape[0]) for b in inputs)
        few_sentences = sum(int(b.shape[0]) for b in few)
        result = {
            "config": name,
            "params": int(model.count_params()),
            "sentences_per_second": round(sentences / seconds, 2),
            "target_tokens_per_second": round(sentences * FLAGS.output_tokens / seconds, 1),
            "uncached_target_tokens_per_second": round(few_sentences * FLAGS.output_tokens / seconds_uncached, 1),
        }
        result["cache_speedup"] = round(
            result["target_tokens_per_second"] / result["uncached_target_tokens_per_second"], 2
        )
        print(json.dumps(result), flush=True)
        results.append(result)
    print(
        json.dumps(
            {
                "benchmark": "decode",
                "beam": FLAGS.beam,
                "batch": FLAGS.batch,
                "sentences": len(lines),
                "output_tokens": FLAGS.output_tokens,
                "results": {r["config"]: r for r in results},
                "machine": machine(),
                "tensorflow": tf.__version__,
                "numpy": np.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

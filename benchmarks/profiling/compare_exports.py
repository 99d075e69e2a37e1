"""Decoding speed of several exports side by side (a tool, not a test): is a change faster, and the same?

    # the same weights exported by two commits (tft-export with --min_length = --max_output_length = 40)
    python -m benchmarks.profiling.compare_exports --export saved_models/before/1 --export saved_models/after/1

A shared machine's speed drifts over minutes, often by more than a change to
the decoder is worth, so timing one export after another decides nothing.
Here every export is loaded into one process and the batches of newstest2013
go through them interleaved: batch ``i`` through every export in turn, the
order rotating from batch to batch and round to round. ``--signature`` chooses
what is timed: ``translate_ids`` (the default; sources tokenized with the first
export's ``assets/sp.model``, outside the timing) or ``serving_default`` (the raw
strings, so the export's own tokenizing and detokenizing are timed too). Each
export's outputs (ids, or translations) are compared with the first export's on
every batch (``ids_identical``: a change meant to be exact must keep them).
Target tokens count the ids each export produced (EOS included); the strings of
``serving_default`` count as the output length the export fixes (min = max in
``assets.extra/tf_transformer.json``), or else as their pieces re-tokenized plus
EOS, an estimate. Exports with a fixed output length do equal work. The last
line is one JSON object.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

import pipelines
from benchmarks.common import machine, rotated, source_batches
from tf_transformer.exporting.export_info import read_export_info

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("export", None, "SavedModel directories (tft-export output); the first is the reference.")
flags.DEFINE_string("data", "../shared/data/newstest/newstest2013.en", "Source sentences, one per line.")
flags.DEFINE_integer("sentences", 512, "Source sentences decoded per round.", lower_bound=1)
flags.DEFINE_integer("batch", 32, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Passes over the sentences.", lower_bound=1)
flags.DEFINE_integer("intra_op_threads", 2, "TensorFlow intra-op threads (1 for exports made with --batch_parts N).")
flags.DEFINE_integer("inter_op_threads", 2, "TensorFlow inter-op threads.")
flags.DEFINE_enum(
    "signature", "translate_ids", ["translate_ids", "serving_default"], "The signature timed: ids in, or strings in."
)
flags.mark_flag_as_required("export")

OUTPUT = {"translate_ids": "ids", "serving_default": "translations"}


def token_counter(path: str, tokenizer: pipelines.Tokenizer):
    """outputs → the target tokens they hold, EOS included (see the module)."""
    if FLAGS.signature == "translate_ids":
        return lambda ids: int(np.count_nonzero(ids))
    options = read_export_info(path).options  # of this version's exports or an earlier one's
    fixed = options.max_output_length if options is not None else None
    if fixed and options.min_length == fixed:
        return lambda translations: len(translations) * fixed

    def retokenized(translations):  # an estimate: detokenizing and tokenizing again may not give the same pieces
        return int(tokenizer.tokenize(tf.constant(translations)).flat_values.shape[0]) + len(translations)

    return retokenized


def main(argv):
    del argv
    import tensorflow_text  # noqa: F401  registers the SentencePiece ops the exports use

    if len(FLAGS.export) < 2:
        raise app.UsageError("give at least two --export directories to compare")
    for path in FLAGS.export:
        if not os.path.exists(os.path.join(path, "saved_model.pb")):
            raise app.UsageError(f"--export {path}: no saved_model.pb there (a tft-export output directory?)")
    if not os.path.exists(FLAGS.data):
        raise app.UsageError(f"--data {FLAGS.data}: not found (real corpora live in ../shared/data)")
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.inter_op_threads)
    lines = [line.strip() for line in pipelines.read_lines(FLAGS.data)][: FLAGS.sentences]
    tokenizer = pipelines.Tokenizer(os.path.join(FLAGS.export[0], "assets", "sp.model"))
    if FLAGS.signature == "translate_ids":
        batches = source_batches(tokenizer, lines, FLAGS.batch)
    else:
        batches = [np.array(lines[start : start + FLAGS.batch], object) for start in range(0, len(lines), FLAGS.batch)]
    translate = [tf.saved_model.load(path).signatures[FLAGS.signature] for path in FLAGS.export]
    count_tokens = [token_counter(path, tokenizer) for path in FLAGS.export]
    for run in translate:  # warm-up: the first call of a signature builds its kernels
        run(inputs=tf.constant(batches[0]))

    count = len(translate)
    seconds, tokens, identical = [0.0] * count, [0] * count, [True] * count
    for round_index in range(FLAGS.rounds):
        for i, batch in enumerate(batches):
            outputs = {}
            for j in rotated(list(range(count)), i + round_index):
                start = time.perf_counter()
                result = translate[j](inputs=tf.constant(batch))
                outputs[j] = result[OUTPUT[FLAGS.signature]].numpy()  # [batch, out_len] ids, or [batch] strings
                seconds[j] += time.perf_counter() - start
                tokens[j] += count_tokens[j](outputs[j])
            for j in range(1, count):
                identical[j] = identical[j] and np.array_equal(outputs[0], outputs[j])

    results = []
    for path, spent, produced, same in zip(FLAGS.export, seconds, tokens, identical, strict=True):
        speed = produced / spent
        results.append(
            {
                "export": path,
                "target_tokens_per_second": round(speed, 1),
                "ratio_to_first": round(speed / (tokens[0] / seconds[0]), 3),
                "ids_identical": same,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    print(
        json.dumps(
            {
                "benchmark": "compare_exports",
                "sentences": len(lines),
                "batch": FLAGS.batch,
                "rounds": FLAGS.rounds,
                "signature": FLAGS.signature,
                "intra_op_threads": FLAGS.intra_op_threads,
                "inter_op_threads": FLAGS.inter_op_threads,
                "results": results,
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

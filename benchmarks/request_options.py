"""Decoding speed of an export's request-time signatures (a benchmark, not a test).

    python -m benchmarks.request_options --export saved_models/multi30k_en_de/1 \
        --data ../shared/data/multi30k/test_2016_flickr.en

``translate_with_options`` at the export's own settings (its beam size, α,
minimum and extra length, no prefix, 1-best) against ``serving_default``, which
decodes with those settings fixed in its graph: the same sentences in batches,
the two signatures interleaved batch by batch (the order rotating), so a
shared machine's drift hits both alike. Their translations must be identical
(``identical``). ``sample`` (temperature 1, top-k 0, top-p 1, one seed) runs in
the same rotation: its sentences per second. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

import pipelines
from benchmarks.common import machine, rotated
from tf_transformer.exporting.export_info import read_export_info

FLAGS = flags.FLAGS
flags.DEFINE_string("export", None, "SavedModel directory (tft-export output, with its request signatures).")
flags.DEFINE_string("data", "../shared/data/multi30k/test_2016_flickr.en", "Source sentences, one per line.")
flags.DEFINE_integer("sentences", 512, "Source sentences decoded per round.", lower_bound=1)
flags.DEFINE_integer("batch", 32, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Passes over the sentences.", lower_bound=1)
flags.DEFINE_integer("intra_op_threads", 2, "TensorFlow intra-op threads.")
flags.DEFINE_integer("inter_op_threads", 2, "TensorFlow inter-op threads.")
flags.mark_flag_as_required("export")


def main(argv):
    del argv
    import tensorflow_text  # noqa: F401  registers the SentencePiece ops the export uses

    if not os.path.exists(os.path.join(FLAGS.export, "saved_model.pb")):
        raise app.UsageError(f"--export {FLAGS.export}: no saved_model.pb there (a tft-export output directory?)")
    if not os.path.exists(FLAGS.data):
        raise app.UsageError(f"--data {FLAGS.data}: not found (real corpora live in ../shared/data)")
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.inter_op_threads)
    info = read_export_info(FLAGS.export)
    options = info.options
    signatures = tf.saved_model.load(FLAGS.export).signatures
    if "translate_with_options" not in signatures:
        raise app.UsageError(f"--export {FLAGS.export} has no request signatures: export it with this version")
    lines = [line.strip() for line in pipelines.read_lines(FLAGS.data)][: FLAGS.sentences]
    batches = [lines[start : start + FLAGS.batch] for start in range(0, len(lines), FLAGS.batch)]
    settings = {
        "beam_size": tf.constant(options.beam_size),
        "alpha": tf.constant(options.alpha, tf.float32),
        "nbest": tf.constant(1),
        "min_length": tf.constant(options.min_length),
        "max_extra_length": tf.constant(options.max_extra_length),
    }
    calls = {
        "serving_default": lambda batch: signatures["serving_default"](inputs=tf.constant(batch))["translations"],
        "translate_with_options": lambda batch: signatures["translate_with_options"](
            inputs=tf.constant(batch), target_prefix=tf.constant([""] * len(batch)), **settings
        )["translations"][:, 0],
        "sample": lambda batch: signatures["sample"](
            inputs=tf.constant(batch),
            seed=tf.constant(1, tf.int64),
            temperature=tf.constant(1.0),
            top_k=tf.constant(0),
            top_p=tf.constant(1.0),
            max_extra_length=tf.constant(options.max_extra_length),
        )["translations"],
    }
    for call in calls.values():  # warm-up: the first call of a signature builds its kernels
        call(batches[0]).numpy()
    seconds = dict.fromkeys(calls, 0.0)
    ratios, identical = [], True
    for round_index in range(FLAGS.rounds):
        spent = dict.fromkeys(calls, 0.0)
        for i, batch in enumerate(batches):
            outputs = {}
            for name in rotated(list(calls), i + round_index):
                start = time.perf_counter()
                outputs[name] = calls[name](batch).numpy()
                spent[name] += time.perf_counter() - start
            identical = identical and np.array_equal(outputs["serving_default"], outputs["translate_with_options"])
        ratios.append(round(spent["translate_with_options"] / spent["serving_default"], 3))
        for name in calls:
            seconds[name] += spent[name]
    decoded = len(lines) * FLAGS.rounds
    print(
        json.dumps(
            {
                "benchmark": "request_options",
                "export": FLAGS.export,
                "task": info.task or "translation",
                "data": FLAGS.data,
                "sentences": len(lines),
                "batch": FLAGS.batch,
                "rounds": FLAGS.rounds,
                "settings": {key: value.numpy().item() for key, value in settings.items()},
                "sentences_per_second": {name: round(decoded / seconds[name], 2) for name in calls},
                "options_time_over_serving_default": round(
                    seconds["translate_with_options"] / seconds["serving_default"], 3
                ),
                "per_round": ratios,
                "identical": bool(identical),
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

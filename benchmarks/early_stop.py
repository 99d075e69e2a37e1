"""The early-stopping rules of beam search on real test sets: BLEU, identical outputs, speed and steps (a benchmark).

    python -m benchmarks.early_stop --model_dir runs/multi30k_en_de \
        --checkpoint runs/multi30k_en_de/averaged/ckpt --work /tmp/early_stop

The run's checkpoint is exported once per rule of ``configs.decoding.EARLY_STOPS``
(``tft-export --early_stop``, each export's ``serving_default`` timed, strings in and
out) and translates each ``--sets`` pair (Multi30k's validation set and test2016 by
default) in file-order batches of ``--batch``, the exports taking turns batch by batch.
For each set and rule: sacreBLEU, the share of outputs identical to the exact rule's,
sentences per second, and the steps the searches ran against the steps each batch's
longest best output needed (its length with EOS), from the same search in this process.
The corpora are ``../shared/data``; without them it says so and stops. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

from benchmarks import skipped_without, start_tensorflow

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Run directory (tft-train output); only read.")
flags.DEFINE_string("checkpoint", None, "Checkpoint prefix (default: the run's newest checkpoint).")
flags.DEFINE_string("work", "/tmp/early_stop_bench", "Where the exports are written (replaced).")
flags.DEFINE_list(
    "sets",
    ["../shared/data/multi30k/val", "../shared/data/multi30k/test_2016_flickr"],
    "Test sets: path prefixes of the .SRC and .TGT files.",
)
flags.DEFINE_string("src", "en", "Source language suffix.")
flags.DEFINE_string("tgt", "de", "Target language suffix.")
flags.DEFINE_integer("batch", 32, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's).", lower_bound=1)
flags.DEFINE_integer("threads", 2, "TensorFlow's intra- and inter-op threads.", lower_bound=1)
flags.mark_flag_as_required("model_dir")


def main(argv):
    del argv
    files = [(f"{prefix}.{FLAGS.src}", f"{prefix}.{FLAGS.tgt}") for prefix in FLAGS.sets]
    if skipped_without("early_stop", [path for pair in files for path in pair]):
        return
    tf = start_tensorflow(FLAGS.threads)

    from benchmarks.common import machine, rotated
    from configs.decoding import EARLY_STOPS
    from tf_transformer.bleu import read_test_set, score
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.inference.translator import Translator
    from tf_transformer.run_dir import checkpoint_dir, checkpoints, restore_model
    from tf_transformer.tasks import run_tokenizer

    checkpoint = FLAGS.checkpoint or checkpoints(checkpoint_dir(FLAGS.model_dir))[-1]
    model, _ = restore_model(FLAGS.model_dir, checkpoint)
    tokenizer = run_tokenizer(FLAGS.model_dir)
    translate, steps_of = {}, {}
    for rule in EARLY_STOPS:
        options = DecodeOptions.for_run(FLAGS.model_dir, early_stop=rule, beam_size=FLAGS.beam_size)
        path = os.path.join(FLAGS.work, rule, "1")
        export_run(
            FLAGS.model_dir, path, options, checkpoint, overwrite=True, alignment_layer=None, request_signatures=False
        )
        signature = tf.saved_model.load(path).signatures["serving_default"]
        translate[rule] = lambda batch, signature=signature: [
            text.decode() for text in signature(inputs=tf.constant(batch))["translations"].numpy()
        ]
        steps_of[rule] = search_steps(tf, Translator(model, tokenizer, options, freeze_weights=True))
    results = {}
    for src, ref in files:
        sources, references = read_test_set(src, ref)
        batches = [sources[start : start + FLAGS.batch] for start in range(0, len(sources), FLAGS.batch)]
        for run in translate.values():  # warm-up
            run(batches[0])
        seconds = dict.fromkeys(translate, 0.0)
        outputs = {rule: [] for rule in translate}
        for i, batch in enumerate(batches):
            for rule in rotated(list(translate), i):
                start = time.perf_counter()
                outputs[rule].extend(translate[rule](batch))
                seconds[rule] += time.perf_counter() - start
        name = os.path.basename(src)
        results[name] = {}
        for rule in translate:
            same = sum(a == b for a, b in zip(outputs[rule], outputs["exact"], strict=True)) / len(sources)
            run, needed = (sum(pair) for pair in zip(*(steps_of[rule](batch) for batch in batches), strict=True))
            scores = score(outputs[rule], references, language=FLAGS.tgt)
            results[name][rule] = {
                "bleu": scores["bleu"],
                "moses_bleu": scores["moses_bleu"],
                "length_ratio": scores["length_ratio"],
                "identical_to_exact": round(same, 4),
                "sentences_per_second": round(len(sources) / seconds[rule], 2),
                "steps_run_per_batch": round(run / len(batches), 2),
                "steps_needed_per_batch": round(needed / len(batches), 2),
                "steps_run_per_needed": round(run / needed, 3),
            }
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    print(
        json.dumps(
            {
                "benchmark": "early_stop",
                "model_dir": FLAGS.model_dir,
                "checkpoint": checkpoint,
                "batch": FLAGS.batch,
                "beam_size": options.beam_size,
                "threads": FLAGS.threads,
                "results": results,
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


def search_steps(tf, translator):
    """``batch → (steps the search ran, steps the batch's longest best output needed)`` of ``translator``."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def search(texts):
        ids, _, steps = translator.search(translator.limit_source(translator.encode_strings(texts)))
        longest = tf.reduce_max(tf.reduce_sum(tf.cast(ids[:, 0] != 0, tf.int32), axis=1))  # with EOS
        return steps, longest

    return lambda batch: tuple(int(value) for value in search(tf.constant(batch)))


if __name__ == "__main__":
    app.run(main)

"""Where a test-set batch's time goes: our export's parts, and CTranslate2's for the same batches (a diagnostic).

    python -m benchmarks.profiling.batch_breakdown --model_dir runs/multi30k_en_de \
        --checkpoint runs/multi30k_en_de/averaged/ckpt --work /tmp/breakdown

TensorBoard's profiler charges the time of small ops to their neighbours
(docs/benchmarks.md), so this times sub-graphs instead. The run's checkpoint is
exported (``tft-export``'s graph, request-time signatures included) and rebuilt in
this process as the same frozen :class:`~tf_transformer.inference.translator.Translator`;
each part is its own ``tf.function``, timed on every batch of ``--src`` (file order,
``--batch`` sentences, the parts taking turns batch by batch):

- ``tokenize``: strings to ids (strip, SentencePiece, EOS, padding, the source limit);
- ``encoder``: the encoder over the ids; ``setup``: the encoder plus what a search
  prepares before its first step (encoder–decoder keys and values, the empty cache);
- ``search``: the ids to n-best ids (encoder and setup included), with the steps it ran,
  and the steps the batch's longest best output needed (its length with EOS);
- ``detokenize``: the best ids to strings;
- ``translate``: all of it in one in-process graph; ``serving_default`` and
  ``translate_with_options`` (beam ``--beam_size``, every other setting at its default):
  the export's signatures, whose difference from ``translate`` is the signature's own
  cost (loading's wrappers, the switch over the compiled beam sizes, the request checks).

A decoding step's cost is ``(search − setup) / steps``. ``--rows`` also times searches
whose outputs are forced to ``--fixed_length`` tokens for several batch sizes: what one
step costs as a function of the rows it computes (what dropping finished sentences
from a batch could save). With ``--ct2`` (the ``reference`` extra) the same batches go
through CTranslate2 float32: SentencePiece in Python, ``translate_batch``, detokenizing,
and its fixed-length steps. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import app, flags

from benchmarks import skipped_without, start_tensorflow

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Run directory (tft-train output); only read.")
flags.DEFINE_string("checkpoint", None, "Checkpoint prefix (default: the run's newest checkpoint).")
flags.DEFINE_string("work", "/tmp/batch_breakdown", "Where the exports are written (replaced).")
flags.DEFINE_string("src", "../shared/data/multi30k/test_2016_flickr.en", "Source sentences, one per line.")
flags.DEFINE_integer("batch", 32, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("beam_size", 4, "Beam size of the export (1: greedy).", lower_bound=1)
flags.DEFINE_integer("threads", 2, "TensorFlow's intra- and inter-op threads, CTranslate2's intra threads.")
flags.DEFINE_integer("sentences", 0, "Use the first this many sentences (0: all).", lower_bound=0)
flags.DEFINE_list("rows", ["32", "16", "8", "4", "1"], "Batch sizes of the fixed-length step timing (empty: none).")
flags.DEFINE_integer("fixed_length", 24, "Output tokens of the fixed-length step timing.", lower_bound=2)
flags.DEFINE_bool("ct2", True, "Also time CTranslate2 float32 on the same batches (needs the reference extra).")
flags.DEFINE_enum("early_stop", None, ["finished", "exact"], "The export's early-stopping rule (default: finished).")
flags.mark_flag_as_required("model_dir")


def main(argv):
    del argv
    if skipped_without("batch_breakdown", (FLAGS.src,)):
        return
    tf = start_tensorflow(FLAGS.threads)

    from benchmarks.common import machine, rotated
    from configs.decoding import SETTINGS
    from pipelines import read_lines
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.decoding.request import DecodeRequest
    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.inference.translator import Translator
    from tf_transformer.run_dir import checkpoint_dir, checkpoints, restore_model
    from tf_transformer.tasks import run_tokenizer

    checkpoint = FLAGS.checkpoint or checkpoints(checkpoint_dir(FLAGS.model_dir))[-1]
    lines = [line.strip() for line in read_lines(FLAGS.src)]
    lines = lines[: FLAGS.sentences] if FLAGS.sentences else lines
    batches = [lines[start : start + FLAGS.batch] for start in range(0, len(lines), FLAGS.batch)]

    model, config = restore_model(FLAGS.model_dir, checkpoint)
    flags_given = {"early_stop": FLAGS.early_stop} if FLAGS.early_stop else {}
    options = DecodeOptions.from_config(config, beam_size=FLAGS.beam_size, **flags_given)
    export_dir = os.path.join(FLAGS.work, "saved_model", "1")
    export_run(FLAGS.model_dir, export_dir, options, checkpoint=checkpoint, overwrite=True, alignment_layer=None)
    from tf_transformer.exporting.export_info import read_export_info

    options = read_export_info(export_dir).options  # with the export's max_source_length
    signatures = tf.saved_model.load(export_dir).signatures
    translator = Translator(model, run_tokenizer(FLAGS.model_dir), options, freeze_weights=True)
    decoding, tokenizer = translator.decoding, translator.tokenizer
    strings = tf.TensorSpec([None], tf.string)
    ids_spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[strings])
    def tokenize(texts):
        return translator.limit_source(translator.encode_strings(texts))

    @tf.function(input_signature=[ids_spec])
    def encoder(ids):
        return decoding.encode(ids)[0]

    @tf.function(input_signature=[ids_spec])
    def setup(ids):
        memory, mask = decoding.encode(ids)
        constants = decoding.constants(memory, translator.frozen_weights.layers, mask)
        sources = tf.reduce_sum(tf.cast(ids != 0, tf.int32), axis=1)  # [batch]
        lengths = options.longest_output(sources, None, None, tf.minimum, tf.maximum)
        cache = decoding.empty_cache(tf.shape(ids)[0], tf.reduce_max(lengths), memory.dtype, options.beam_size)
        return [constants["memory"]["key"], *cache["layers"][-1].values(), cache["history"]]

    @tf.function(input_signature=[ids_spec])
    def search(ids):
        return translator.search(ids)

    @tf.function(input_signature=[ids_spec])
    def detokenize(ids):
        return tokenizer.detokenize_target(ids)

    @tf.function(input_signature=[strings])
    def translate(texts):
        return translator.translate(texts)

    beam = {name: tf.constant(value, SETTINGS[name].dtype) for name, value in DecodeRequest().values(options).items()}
    with_options = signatures.get("translate_with_options")

    parts = {
        "tokenize": lambda texts, ids, best: tokenize(texts).numpy(),
        "encoder": lambda texts, ids, best: encoder(ids).numpy(),
        "setup": lambda texts, ids, best: [t.numpy() for t in setup(ids)],
        "search": lambda texts, ids, best: [t.numpy() for t in search(ids)],
        "detokenize": lambda texts, ids, best: detokenize(best).numpy(),
        "translate": lambda texts, ids, best: translate(texts)["translations"].numpy(),
        "serving_default": lambda texts, ids, best: signatures["serving_default"](inputs=texts)["translations"].numpy(),
    }
    if with_options is not None:
        empty = tf.constant([""] * FLAGS.batch)
        parts["translate_with_options"] = lambda texts, ids, best: with_options(
            inputs=texts, target_prefix=empty[: texts.shape[0]], **beam
        )["translations"].numpy()
    prepared = []
    for batch in batches:
        texts = tf.constant(batch)
        ids = tokenize(texts)
        found, _, steps = search(ids)
        best = found[:, 0]  # [batch, out_len]: 0-padded after EOS
        longest = int(tf.reduce_max(tf.reduce_sum(tf.cast(best != 0, tf.int32), axis=1)))  # with EOS
        prepared.append((texts, ids, best, int(steps), longest))
    for run in parts.values():  # warm-up
        run(*prepared[0][:3])
    seconds = dict.fromkeys(parts, 0.0)
    for i, (texts, ids, best, _, _) in enumerate(prepared):
        for name in rotated(list(parts), i):
            start = time.perf_counter()
            parts[name](texts, ids, best)
            seconds[name] += time.perf_counter() - start
    count = len(prepared)
    per_batch = {name: round(1000 * value / count, 2) for name, value in seconds.items()}
    steps_run = sum(p[3] for p in prepared)
    steps_needed = sum(p[4] for p in prepared)
    step_ms = 1000 * (seconds["search"] - seconds["setup"]) / steps_run
    ours = {
        "milliseconds_per_batch": per_batch,
        "steps_run_per_batch": round(steps_run / count, 2),
        "steps_needed_per_batch": round(steps_needed / count, 2),
        "step_milliseconds": round(step_ms, 3),
        "sentences_per_second": {
            name: round(len(lines) / seconds[name], 2) for name in ("translate", "serving_default")
        },
    }
    print(f"ours: {json.dumps(ours)}", flush=True)

    rows = {}
    if FLAGS.rows:
        fixed = translator.with_options(min_length=FLAGS.fixed_length, max_output_length=FLAGS.fixed_length)
        fixed_search = tf.function(lambda ids: fixed.search(ids), input_signature=[ids_spec])
        first = prepared[0][1]
        for size in (int(value) for value in FLAGS.rows):
            ids = tf.tile(first, [-(-size // first.shape[0]), 1])[:size]
            rows[size] = round(1000 * step_seconds(lambda ids=ids: fixed_search(ids)[0].numpy(), FLAGS.fixed_length), 3)
        print(f"ours, milliseconds per step by batch size (outputs of {FLAGS.fixed_length}): {rows}", flush=True)

    result = {
        "benchmark": "batch_breakdown",
        "model_dir": FLAGS.model_dir,
        "checkpoint": checkpoint,
        "src": FLAGS.src,
        "sentences": len(lines),
        "batch": FLAGS.batch,
        "beam_size": options.beam_size,
        "early_stop": options.early_stop,
        "threads": FLAGS.threads,
        "ours": {**ours, "fixed_length_step_milliseconds_by_rows": rows},
    }
    if FLAGS.ct2:
        result["ctranslate2_float32"] = ct2_breakdown(checkpoint, batches, config.max_extra_length)
        print(f"ctranslate2: {json.dumps(result['ctranslate2_float32'])}", flush=True)
    result.update(machine=machine(), tensorflow=tf.__version__)
    print(json.dumps(result))


def step_seconds(run, length: int, repeats: int = 5) -> float:
    """Seconds per step of ``run`` (a search of ``length`` steps): the best of ``repeats`` after a warm-up."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best / length


def ct2_breakdown(checkpoint: str, batches: list, max_extra_length: int) -> dict:
    """CTranslate2 float32's milliseconds per batch: SentencePiece, ``translate_batch``, detokenizing; and per step."""
    import sentencepiece as spm

    from tf_transformer.exporting.ctranslate2 import export_ctranslate2, import_ctranslate2

    ctranslate2 = import_ctranslate2()
    path = export_ctranslate2(
        FLAGS.model_dir, os.path.join(FLAGS.work, "ct2_float32"), checkpoint=checkpoint, overwrite=True
    )
    processor = spm.SentencePieceProcessor(model_file=os.path.join(path, "sp.model"))
    translator = ctranslate2.Translator(path, device="cpu", intra_threads=FLAGS.threads, inter_threads=1)
    beam = FLAGS.beam_size

    def decode(pieces, **settings):
        settings.setdefault("max_decoding_length", max(map(len, pieces)) + max_extra_length)
        return translator.translate_batch(pieces, beam_size=beam, suppress_sequences=[["<pad>"], ["<s>"]], **settings)

    parts = {
        "tokenize": lambda batch, pieces, outputs: processor.encode(batch, out_type=str),
        "search": lambda batch, pieces, outputs: decode(pieces),
        "detokenize": lambda batch, pieces, outputs: [processor.decode(o) for o in outputs],
    }
    prepared = []
    for batch in batches:
        pieces = processor.encode(batch, out_type=str)
        prepared.append((batch, pieces, [r.hypotheses[0] for r in decode(pieces)]))
    for run in parts.values():
        run(*prepared[0])
    seconds = dict.fromkeys(parts, 0.0)
    for batch, pieces, outputs in prepared:
        for name, run in parts.items():
            start = time.perf_counter()
            run(batch, pieces, outputs)
            seconds[name] += time.perf_counter() - start
    rows = {}
    length = FLAGS.fixed_length
    for size in (int(value) for value in FLAGS.rows):
        pieces = (prepared[0][1] * size)[:size]
        fixed = lambda p=pieces: decode(p, min_decoding_length=length, max_decoding_length=length)  # noqa: E731
        rows[size] = round(1000 * step_seconds(fixed, length), 3)
    total = sum(seconds.values())
    return {
        "milliseconds_per_batch": {name: round(1000 * value / len(prepared), 2) for name, value in seconds.items()},
        "sentences_per_second": round(sum(len(b) for b in batches) / total, 2),
        "fixed_length_step_milliseconds_by_rows": rows,
        "mean_output_pieces": round(float(np.mean([len(o) for p in prepared for o in p[2]])), 2),
    }


if __name__ == "__main__":
    app.run(main)

"""``tft-translate``: translate lines from stdin with an exported SavedModel.

    tft-translate --model saved_models/multi30k_en_de/1 < in.txt > out.txt
    tft-translate --model_dir runs/m30k --beam_size 8 --alpha 1.0 --nbest 3 < in.txt
    tft-translate --model saved_models/multi30k_en_de/1 --workers 2 < in.txt > out.txt   # 2 batches at once

Standard input is read --chunk_size lines at a time; each chunk is batched by length,
translated and written in input order before the next is read, so memory holds one chunk
and a failure keeps what was written. Progress goes to stderr.
"""

from __future__ import annotations

import sys

from absl import app, flags

from tf_transformer.cli import apply_thread_flags, check_model_flags, define_thread_flags, run_main
from tf_transformer.inference.batch_translation import (
    checked_sources,
    checkpoint_translate,
    export_translate,
    postprocessed,
    translate_stream,
)

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Exported SavedModel directory (beam size and α fixed at export).")
flags.DEFINE_string("model_dir", None, "Or a training run directory: decodes its averaged or newest checkpoint.")
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer(
    "chunk_size",
    10_000,
    "Lines read, sorted by length and translated before their translations are written and more is read.",
    lower_bound=1,
)
flags.DEFINE_integer("beam_size", None, "Beam size (--model_dir only; default: the config's, 4).", lower_bound=1)
flags.DEFINE_float("alpha", None, "Length penalty α (--model_dir only; default: the config's, 0.6).")
flags.DEFINE_integer("nbest", 1, "Hypotheses per input (--model_dir only), written 'index<TAB>score<TAB>text'.")
flags.DEFINE_bool("scores", False, "Write 'score<TAB>translation' lines.")
flags.DEFINE_bool(
    "alignment",
    False,
    "Append '<TAB>i-j …' to each line: source-target word pairs from the export's translate_with_alignment "
    "signature (--model only).",
)
flags.DEFINE_integer(
    "batch_parts", 1, "Batch parts decoded side by side (--model_dir only; an export fixes its own).", lower_bound=1
)
flags.DEFINE_alias("streams", "batch_parts")  # the name of earlier versions
flags.DEFINE_integer(
    "workers",
    1,
    "Batches translated at once, each on its own thread; output order is kept. With --intra_op_threads 0 the "
    "intra-op pool gets cores / (workers × --batch_parts) threads (docs/inference.md).",
    lower_bound=1,
)
define_thread_flags()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.alignment and not FLAGS.model:
        raise app.UsageError("--alignment needs --model: an export with the translate_with_alignment signature")
    if FLAGS.model and (FLAGS.beam_size or FLAGS.alpha is not None or FLAGS.nbest != 1 or FLAGS.batch_parts != 1):
        raise app.UsageError(
            "--beam_size, --alpha, --nbest and --batch_parts are fixed when exporting (tft-export); "
            "use --model_dir to choose them at translation time"
        )
    check_model_flags(FLAGS.model, FLAGS.model_dir)  # after the flags' combinations: they need no files
    apply_thread_flags(FLAGS.workers * FLAGS.batch_parts)  # searches at once: batches × each one's parts
    from pipelines import DataError, split_lines

    def progress(done, total):
        print(f"\rtranslated {done}", end="", file=sys.stderr, flush=True)

    try:
        if FLAGS.model:
            translate = export_translate(FLAGS.model, alignment=FLAGS.alignment)
        else:
            from tf_transformer.run_dir import default_checkpoint

            checkpoint = default_checkpoint(FLAGS.model_dir)
            print(f"checkpoint: {checkpoint}", file=sys.stderr, flush=True)
            from tf_transformer.inference.decode_options import DecodeOptions

            options = DecodeOptions.for_run(
                FLAGS.model_dir, beam_size=FLAGS.beam_size, alpha=FLAGS.alpha, batch_parts=FLAGS.batch_parts
            )
            translate = checkpoint_translate(FLAGS.model_dir, options, FLAGS.nbest, checkpoint)
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    from tf_transformer.cli import model_task

    translate = postprocessed(translate, model_task(FLAGS.model, FLAGS.model_dir).postprocess)  # a parser: trees
    lines = split_lines(sys.stdin.buffer, "<stdin>")  # the lines training and tft-evaluate would read
    if FLAGS.model:
        lines = checked_sources(lines, FLAGS.model, "<stdin>")  # a line over the export's limit is named
    results = translate_stream(translate, lines, FLAGS.batch_size, FLAGS.chunk_size, FLAGS.workers, progress)
    try:
        for index, result in enumerate(results):
            if FLAGS.model_dir:
                for text, score in result:
                    if FLAGS.nbest > 1:
                        print(f"{index}\t{score:.4f}\t{text}")
                    else:
                        print(f"{score:.4f}\t{text}" if FLAGS.scores else text)
            else:
                text, score, *alignment = result
                line = f"{score:.4f}\t{text}" if FLAGS.scores else text
                print("\t".join([line, *alignment]))
            if (index + 1) % FLAGS.chunk_size == 0:
                sys.stdout.flush()  # a chunk's translations are out before the next chunk is read
    except DataError as error:
        sys.stdout.flush()
        print(file=sys.stderr)
        raise app.UsageError(f"{error} (the translations of the lines before its chunk were written)") from None
    print(file=sys.stderr)


def run():
    run_main(main)


if __name__ == "__main__":
    run()

"""``tft-translate``: translate lines from stdin with an exported SavedModel.

    tft-translate --model saved_models/multi30k_en_de/1 < in.txt > out.txt
    tft-translate --model_dir runs/m30k --beam_size 8 --alpha 1.0 --nbest 3 < in.txt
    tft-translate --model saved_models/multi30k_en_de/1 --workers 2 < in.txt > out.txt   # 2 batches at once
    tft-translate --model saved_models/multi30k_en_de/1 --beam_size 8 --nbest 4 < in.txt      # per request
    tft-translate --model saved_models/multi30k_en_de/1 --target_prefix prefixes.txt < in.txt
    tft-translate --model saved_models/multi30k_en_de/1 --sampling --top_k 10 --seed 3 < in.txt

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
    with_prefixes,
)

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Exported SavedModel directory (beam size and α fixed at export).")
flags.DEFINE_string("model_dir", None, "Or a training run directory: decodes its averaged or newest checkpoint.")
flags.DEFINE_string(
    "checkpoint",
    None,
    "--model_dir only: a checkpoint prefix, or 'best' for the run's best checkpoint (--keep_best_by); default: "
    "MODEL_DIR/averaged/ckpt while current, else the newest.",
)
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer(
    "chunk_size",
    10_000,
    "Lines read, sorted by length and translated before their translations are written and more is read.",
    lower_bound=1,
)
flags.DEFINE_integer(
    "beam_size",
    None,
    "Beam size (default: the config's or export's; an export takes 1, 2, 4, 8 or its own).",
    lower_bound=1,
)
flags.DEFINE_float("alpha", None, "Length penalty α (default: the config's or export's).", lower_bound=0)
flags.DEFINE_integer(
    "nbest", 1, "Hypotheses per input, written 'index<TAB>score<TAB>text' (at most the beam size).", lower_bound=1
)
flags.DEFINE_integer(
    "min_length",
    None,
    "No EOS before this many output tokens, EOS counted (default 2: EOS never first).",
    lower_bound=0,
)
flags.DEFINE_integer(
    "max_extra_length", None, "Longest output = input length + this (an export's is its most).", lower_bound=0
)
flags.DEFINE_string(
    "target_prefix",
    None,
    "File of target prefixes, one per input line ('' for none): each output starts with its line's prefix "
    "(docs/inference.md#target-prefixes).",
)
flags.DEFINE_bool(
    "sampling",
    False,
    "Draw each next token from the model's distribution (--temperature, --top_k, --top_p, --seed) instead of a "
    "beam search: one output per line, scored by its log-probability (docs/inference.md#sampling).",
)
flags.DEFINE_float("temperature", 1.0, "--sampling: divide the log-probabilities by this.")
flags.DEFINE_integer("top_k", 0, "--sampling: draw among the k most probable tokens (0: all).", lower_bound=0)
flags.DEFINE_float("top_p", 1.0, "--sampling: then among the fewest whose probability reaches p (1: all).")
flags.DEFINE_integer("seed", 1, "--sampling: the seed; the same seed and input give the same outputs.")
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
    if FLAGS.model and FLAGS.checkpoint:
        raise app.UsageError("--checkpoint needs --model_dir: an export holds the weights of one checkpoint")
    if FLAGS.alignment and not FLAGS.model:
        raise app.UsageError("--alignment needs --model: an export with the translate_with_alignment signature")
    search_flags = {
        name: getattr(FLAGS, name)
        for name in ("beam_size", "alpha", "min_length", "max_extra_length")
        if getattr(FLAGS, name) is not None
    }
    if FLAGS.model and FLAGS.batch_parts != 1:
        raise app.UsageError("--batch_parts is fixed when exporting (tft-export); use --model_dir to choose it")
    if FLAGS.alignment and (search_flags or FLAGS.nbest != 1 or FLAGS.target_prefix or FLAGS.sampling):
        raise app.UsageError(
            "--alignment comes from the export's translate_with_alignment signature, at the export's settings: "
            "drop --beam_size, --alpha, --min_length, --max_extra_length, --nbest, --target_prefix and --sampling"
        )
    sampling = None
    if FLAGS.sampling:
        if FLAGS.nbest != 1 or FLAGS.target_prefix or set(search_flags) - {"max_extra_length"}:
            raise app.UsageError(
                "--sampling draws one output per line: it takes no --nbest, --target_prefix, "
                "--beam_size, --alpha or --min_length"
            )
        from tf_transformer.decoding.decode_options import Sampling

        try:
            sampling = Sampling(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, FLAGS.seed)
        except ValueError as error:
            raise app.UsageError(f"--{error}") from None
    elif (FLAGS.temperature, FLAGS.top_k, FLAGS.top_p) != (1.0, 0, 1.0):
        raise app.UsageError("--temperature, --top_k and --top_p need --sampling")
    check_model_flags(FLAGS.model, FLAGS.model_dir)  # after the flags' combinations: they need no files
    apply_thread_flags(FLAGS.workers * FLAGS.batch_parts)  # searches at once: batches × each one's parts
    from pipelines import DataError, split_lines

    def progress(done, total):
        print(f"\rtranslated {done}", end="", file=sys.stderr, flush=True)

    with_prefix = FLAGS.target_prefix is not None
    try:
        if FLAGS.model:
            translate = export_translate(
                FLAGS.model,
                alignment=FLAGS.alignment,
                nbest=FLAGS.nbest,
                options=search_flags,
                sampling=sampling,
                with_prefix=with_prefix,
            )
        else:
            from tf_transformer.run_dir import resolve_checkpoint

            checkpoint = resolve_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
            print(f"checkpoint: {checkpoint}", file=sys.stderr, flush=True)
            from tf_transformer.decoding.decode_options import DecodeOptions

            options = DecodeOptions.for_run(FLAGS.model_dir, batch_parts=FLAGS.batch_parts, **search_flags)
            translate = checkpoint_translate(FLAGS.model_dir, options, FLAGS.nbest, checkpoint, sampling, with_prefix)
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    from tf_transformer.cli import model_task

    translate = postprocessed(translate, model_task(FLAGS.model, FLAGS.model_dir).postprocess)  # a parser: trees
    lines = split_lines(sys.stdin.buffer, "<stdin>")  # the lines training and tft-evaluate would read
    if with_prefix:
        lines = with_prefixes(lines, FLAGS.target_prefix)
    if FLAGS.model:
        lines = checked_sources(lines, FLAGS.model, "<stdin>")  # a line over the export's limit is named
    results = translate_stream(translate, lines, FLAGS.batch_size, FLAGS.chunk_size, FLAGS.workers, progress)
    try:
        for index, result in enumerate(results):
            if isinstance(result, list):  # n-best
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
    except Exception as error:
        import tensorflow as tf

        if not isinstance(error, tf.errors.InvalidArgumentError):
            raise
        from tf_transformer.exporting.export_info import graph_error

        sys.stdout.flush()
        print(file=sys.stderr)
        raise app.UsageError(f"{graph_error(error)} (the translations of the chunks before were written)") from None
    print(file=sys.stderr)


def run():
    run_main(main)


if __name__ == "__main__":
    run()

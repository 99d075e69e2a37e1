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

A corpus (a teacher's translations of a training set, docs/distillation.md), resumably and in shards:

    tft-translate --model teacher/1 --input train.en --output train.teacher.de --shard 0/4   # one of 4 tasks
    tft-translate --output train.teacher.de --join 4                                       # once all are done

With --output, each chunk is committed to disk as it is done: a run killed at any point and
started again goes on from the last commit, and its file is the same as an uninterrupted run's
(:mod:`tf_transformer.inference.corpus_translation`).
"""

from __future__ import annotations

import sys

from absl import app, flags

from tf_transformer.cli import run_main
from tf_transformer.cli.flag_groups import (
    apply_thread_flags,
    check_model_flags,
    constrained,
    decode_request,
    define_batch_flags,
    define_constrained_flag,
    define_decoding_flags,
    define_early_stop_flag,
    define_model_flags,
    define_thread_flags,
)
from tf_transformer.inference.batch_translation import (
    checked_sources,
    checkpoint_translate,
    export_translate,
    postprocessed,
    translate_stream,
    with_prefixes,
)

FLAGS = flags.FLAGS
define_model_flags(
    "Exported SavedModel directory (an export takes beam sizes 1, 2, 4, 8 or its own, and lengths up to its own).",
    "Or a training run directory: decodes its averaged or newest checkpoint.",
)
define_decoding_flags(sampling=True)
flags.DEFINE_string(
    "target_prefix",
    None,
    "File of target prefixes, one per input line ('' for none): each output starts with its line's prefix "
    "(docs/inference.md#target-prefixes).",
)
flags.DEFINE_bool("scores", False, "Write 'score<TAB>translation' lines.")
flags.DEFINE_string("input", None, "Source file (default: standard input).")
flags.DEFINE_string(
    "output",
    None,
    "Write the 1-best translations to this file instead of standard output, committing each chunk: a killed run "
    "started again goes on where it stopped (needs --input).",
)
flags.DEFINE_string(
    "shard",
    None,
    "i/N: translate the i-th of N runs of consecutive lines of --input into OUTPUT-0000i-of-0000N, independently "
    "of the other shards (any order, any machine); --join N joins them.",
)
flags.DEFINE_integer("join", None, "Join the N complete shards of --output into --output, then exit.", lower_bound=1)
flags.DEFINE_bool(
    "alignment",
    False,
    "Append '<TAB>i-j …' to each line: source-target word pairs from the export's translate_with_alignment "
    "signature (--model only).",
)
define_batch_flags()
flags.DEFINE_integer(
    "chunk_size",
    10_000,
    "Lines read, sorted by length and translated before their translations are written and more is read.",
    lower_bound=1,
)
flags.DEFINE_integer(
    "batch_parts", 1, "Batch parts decoded side by side (--model_dir only; an export fixes its own).", lower_bound=1
)
define_early_stop_flag(" --model_dir only; an export fixes its own.")
define_constrained_flag(" --model_dir only; an export fixes its own.")
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
    if FLAGS.join is not None:
        return join(FLAGS.output, FLAGS.join)
    check_corpus_flags()
    request = decode_request(prefix=FLAGS.target_prefix is not None)
    if FLAGS.model and FLAGS.batch_parts != 1:
        raise app.UsageError("--batch_parts is fixed when exporting (tft-export); use --model_dir to choose it")
    if FLAGS.model and FLAGS.early_stop is not None:
        raise app.UsageError("--early_stop is fixed when exporting (tft-export); use --model_dir to choose it")
    if FLAGS.sampling and FLAGS.early_stop is not None:
        raise app.UsageError("--early_stop is beam search's: --sampling draws one output per line and stops at EOS")
    if FLAGS.alignment and not FLAGS.model:
        raise app.UsageError("--alignment needs --model: an export with the translate_with_alignment signature")
    if FLAGS.alignment and not request.is_default():
        raise app.UsageError(
            "--alignment comes from the export's translate_with_alignment signature, at the export's settings: "
            "drop --beam_size, --alpha, --min_length, --max_extra_length, --nbest, --target_prefix and --sampling"
        )
    check_model_flags()  # after the flags' combinations: they need no files
    apply_thread_flags(FLAGS.workers * FLAGS.batch_parts)  # searches at once: batches × each one's parts
    from pipelines import split_lines
    from tf_transformer.cli import model_task

    task = model_task(FLAGS.model, FLAGS.model_dir)
    constrain = constrained(task)
    checkpoint = None
    try:
        if FLAGS.model:
            translate = export_translate(FLAGS.model, request, FLAGS.alignment)
        else:
            from tf_transformer.decoding.decode_options import DecodeOptions
            from tf_transformer.run_dir import resolve_checkpoint

            checkpoint = resolve_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
            print(f"checkpoint: {checkpoint}", file=sys.stderr, flush=True)
            options = DecodeOptions.for_run(
                FLAGS.model_dir,
                constrain,
                batch_parts=FLAGS.batch_parts,
                early_stop=FLAGS.early_stop,
            )
            translate = checkpoint_translate(FLAGS.model_dir, request, options, checkpoint)
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    split = None  # a parser's export splits raw lines into words: its trees are over those
    if FLAGS.model:
        from tf_transformer.exporting.export_info import read_export_info

        split = read_export_info(FLAGS.model).options.word_tokenizer
    translate = postprocessed(translate, lambda source, text: task.postprocess(source, text, split))  # trees
    if FLAGS.output is not None:
        return translate_corpus(translate, request, checkpoint)
    if FLAGS.input is not None:
        with open(FLAGS.input, "rb") as handle:
            return translate_lines(translate, request, split_lines(handle, FLAGS.input), FLAGS.input)
    return translate_lines(translate, request, split_lines(sys.stdin.buffer, "<stdin>"), "<stdin>")


def translate_lines(translate, request, lines, name: str) -> None:
    """Translates ``lines`` (read from ``name``) to standard output, a chunk at a time."""
    from pipelines import DataError

    def progress(done, total):
        print(f"\rtranslated {done}", end="", file=sys.stderr, flush=True)

    if request.prefix:
        lines = with_prefixes(lines, FLAGS.target_prefix)
    if FLAGS.model:
        lines = checked_sources(lines, FLAGS.model, name)  # a line over the export's limit is named
    results = translate_stream(translate, lines, FLAGS.batch_size, FLAGS.chunk_size, FLAGS.workers, progress)
    try:
        for index, result in enumerate(results):
            write_result(index, result)
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


def check_corpus_flags() -> None:
    """The corpus flags' combinations (no files read)."""
    if FLAGS.shard is not None and FLAGS.output is None:
        raise app.UsageError("--shard writes OUTPUT-0000i-of-0000N: give --output")
    if FLAGS.shard is not None:
        from tf_transformer.inference.corpus_translation import Shard

        try:
            Shard.parse(FLAGS.shard)
        except ValueError as error:
            raise app.UsageError(str(error)) from None
    if FLAGS.output is None:
        return
    if FLAGS.input is None:
        raise app.UsageError("--output translates a file: give --input (standard input cannot be read again)")
    given = [f"--{name}" for name in ("scores", "alignment", "target_prefix") if FLAGS[name].present]
    if FLAGS.nbest > 1:
        given.append("--nbest")
    if given:
        raise app.UsageError(f"--output writes 1-best translations, one per line: drop {', '.join(given)}")


def translate_corpus(translate, request, checkpoint: str | None) -> None:
    """``--input`` (one ``--shard`` of it) translated into ``--output``, committed a chunk at a time; resumable."""
    import os

    from tf_transformer.inference.corpus_translation import Shard, progress_line, translate_shard

    shard = Shard.parse(FLAGS.shard) if FLAGS.shard is not None else Shard()  # checked by check_corpus_flags
    too_long = None
    if FLAGS.model:
        from tf_transformer.exporting.export_info import SourceLimit

        limits = SourceLimit(FLAGS.model)
        too_long = lambda line: limits.violation(line) is not None  # noqa: E731
    settings = {
        "model": os.path.abspath(FLAGS.model or FLAGS.model_dir),
        "checkpoint": checkpoint,  # --model_dir's, resolved: a newer one would translate differently
        "request": repr(request),
        "batch_size": FLAGS.batch_size,
    }

    def report(done, lines, rate):
        print(f"\r{progress_line(shard, done, lines, rate)}", end="", file=sys.stderr, flush=True)

    try:
        done = translate_shard(
            translate, FLAGS.input, FLAGS.output, shard, settings, FLAGS.chunk_size, too_long=too_long, report=report
        )
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    print(f"\n{done.summary()}", file=sys.stderr)


def join(output: str | None, count: int) -> None:
    """``--join N``: the shards of ``--output`` joined into it."""
    from tf_transformer.inference.corpus_translation import join_shards

    if output is None:
        raise app.UsageError("--join joins the shards of --output: give --output")
    try:
        lines = join_shards(output, count)
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    print(f"{output}: {lines:,} lines from {count} shards", file=sys.stderr)


def write_result(index: int, result) -> None:
    """One input's output lines: n-best ``index<TAB>score<TAB>text`` lines, or its text (``--scores``: with its
    score first; ``--alignment``: with its word pairs last)."""
    if isinstance(result, list):  # n-best
        for text, score in result:
            if FLAGS.nbest > 1:
                print(f"{index}\t{score:.4f}\t{text}")
            else:
                print(f"{score:.4f}\t{text}" if FLAGS.scores else text)
        return
    text, score, *alignment = result
    line = f"{score:.4f}\t{text}" if FLAGS.scores else text
    print("\t".join([line, *alignment]))


def run():
    run_main(main)


if __name__ == "__main__":
    run()

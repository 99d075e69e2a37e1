"""``tft-parse``: parse English sentences from stdin into Penn Treebank trees (section 6.3), one per line.

    echo "The cat sat on the mat." | tft-parse --model saved_models/ptb/1
    tft-parse --model_dir runs/ptb --pretokenized < dev.words > dev.trees

Each line is one sentence. It is tokenized as the Penn Treebank is (nltk's
``TreebankWordTokenizer`` with ``convert_parentheses``: ``n't``, ``-LRB-``,
quotes as ``````/``''``) unless ``--pretokenized`` says it already is; the
model's output is repaired into a tree over exactly those words
(docs/parsing.md), with the placeholder tag ``XX`` where the model does not
predict tags. Repairs are counted on stderr.
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
    define_model_flags,
    define_thread_flags,
)

FLAGS = flags.FLAGS
define_model_flags(
    "Exported parser (SavedModel directory; beam and α fixed at export).",
    "Or a parsing run directory: decodes its averaged or newest checkpoint.",
    checkpoint=False,
)
flags.DEFINE_bool("pretokenized", False, "Lines are Penn Treebank tokens separated by spaces already.")
define_batch_flags(32)
define_decoding_flags(("beam_size", "alpha"), " (--model_dir only; a parsing run's: 21 and 0.3)")
define_constrained_flag(" --model_dir only; an export fixes its own.")
define_thread_flags()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    request = decode_request(allow_with_model=())
    check_model_flags()
    apply_thread_flags()
    from pipelines import DataError, split_lines
    from tf_transformer.cli import model_task
    from tf_transformer.inference.batch_translation import (
        checked_sources,
        checkpoint_translate,
        export_translate,
        translate_stream,
    )
    from tf_transformer.tasks.parsing.linearization import repair
    from tf_transformer.tasks.parsing.penn import penn_tokens
    from tf_transformer.tasks.parsing.treebank import one_line

    task = model_task(FLAGS.model, FLAGS.model_dir)
    if task.name != "parsing":
        raise app.UsageError(f"this model's task is {task.name}, not parsing: use tft-translate")
    constrain = constrained(task)
    try:
        if FLAGS.model:
            translate = export_translate(FLAGS.model, tokenized=True)  # split here, as --model_dir's are
        else:
            from tf_transformer.decoding.decode_options import DecodeOptions

            options = DecodeOptions.for_run(FLAGS.model_dir, constrained=constrain)
            run = checkpoint_translate(FLAGS.model_dir, request, options)
            translate = lambda batch: [result[0] for result in run(batch)]  # noqa: E731  (the best of each)
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    lines = split_lines(sys.stdin.buffer, "<stdin>")
    sentences = (line.strip() if FLAGS.pretokenized else penn_tokens(line) for line in lines)
    if FLAGS.model:
        sentences = checked_sources(sentences, FLAGS.model, "<stdin>", tokenized=True)
    parsed = repaired = 0
    try:
        paired = lambda batch: list(zip(batch, translate(batch), strict=True))  # noqa: E731
        for words, (output, *_) in translate_stream(paired, sentences, FLAGS.batch_size, chunk_size=1000):
            tree, repairs = repair(output.split(), words.split(), task.linearization)
            print(one_line(tree) if words else "")
            parsed += 1
            repaired += not repairs.well_formed
    except DataError as error:
        sys.stdout.flush()
        raise app.UsageError(f"{error} (the trees of the lines before it were written)") from None
    print(f"parsed {parsed} sentences; {repaired} needed a repair", file=sys.stderr)


def run():
    run_main(main)


if __name__ == "__main__":
    run()

"""``tft-evaluate``: decode a test set and score it: sacreBLEU and chrF, or a parser's EVALB F1.

    tft-evaluate --model saved_models/multi30k_en_de/1 --src test.en --ref test.de
    tft-evaluate --model_dir runs/m30k --src test.en --ref test.de --lowercase --tokenize 13a
    tft-evaluate --model saved_models/ptb/1 --src dev.words --ref dev.mrg
    tft-evaluate --model saved_models/ptb/1 --ref dev.mrg      # a parser: the words of the gold trees

The task comes from the export or the run. Translation scores detokenized,
cased text by default (sacreBLEU's signature is printed), and beside it the
BLEU of the Multi30k papers, on lowercased Moses tokens of ``--tgt``'s language
(``moses_bleu``); ``--lowercase --tokenize 13a`` is sacreBLEU's ``-lc``. A
parser's ``--src`` holds one tokenized sentence per line and ``--ref`` its
gold trees (without ``--src``, the gold trees' own words are parsed);
outputs are repaired into trees first (docs/parsing.md). The last line is
one JSON object with the scores.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from tf_transformer.cli import run_main
from tf_transformer.cli.flag_groups import (
    check_model_flags,
    constrained,
    decode_request,
    define_batch_flags,
    define_constrained_flag,
    define_decoding_flags,
    define_model_flags,
)

FLAGS = flags.FLAGS
define_model_flags("Exported SavedModel directory.", "Or a training run directory (its averaged or newest checkpoint).")
flags.DEFINE_string("src", None, "Source sentences, one per line (a parser: default, the words of --ref's trees).")
flags.DEFINE_string(
    "ref", None, "Reference translations, line-aligned with --src (a parser: gold trees, .mrg).", required=True
)
flags.DEFINE_string("output", None, "Write the hypotheses here (default: print none).")
flags.DEFINE_bool("lowercase", False, "Lowercase before BLEU (translation).")
flags.DEFINE_string("tokenize", None, "sacreBLEU tokenizer (13a, intl, none, …; translation; default 13a).")
flags.DEFINE_string(
    "tgt", None, "Language of --ref for the Moses-tokenized BLEU (translation; default: --ref's suffix, test.de → de)."
)
define_decoding_flags(("beam_size", "alpha"), " (--model_dir only)")
define_batch_flags()
define_constrained_flag(" --model_dir only; an export fixes its own.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    request = decode_request(allow_with_model=())
    check_model_flags()
    from tf_transformer.cli import model_task, read_test_set
    from tf_transformer.inference.batch_translation import translate_lines, translate_with_checkpoint

    task = model_task(FLAGS.model, FLAGS.model_dir)
    constrain = constrained(task)
    metric_options = {"lowercase": FLAGS.lowercase, "tokenize": FLAGS.tokenize or "13a"}
    if task.metric == "bleu":
        from tf_transformer.bleu import language_of

        metric_options["language"] = FLAGS.tgt or language_of(FLAGS.ref)
        if not metric_options["language"]:
            print(f"no Moses-tokenized BLEU: {FLAGS.ref} names no language, pass --tgt", file=sys.stderr)
    else:
        if FLAGS.lowercase or FLAGS.tokenize or FLAGS.tgt:
            raise app.UsageError(f"--lowercase, --tokenize and --tgt are BLEU's: this model's task is {task.name}")
        metric_options = {}
    sources, references = read_test_set(task, FLAGS.model, FLAGS.src, FLAGS.ref, "--ref")

    def progress(done, total):
        print(f"\rtranslated {done}/{total}", end="", file=sys.stderr, flush=True)

    if FLAGS.model:
        tokenized = task.word_tokenizer is not None  # a parser's sources: the words of trees, split already
        hypotheses = [
            text for text, _ in translate_lines(FLAGS.model, sources, FLAGS.batch_size, progress, tokenized=tokenized)
        ]
    else:
        from tf_transformer.decoding.decode_options import DecodeOptions
        from tf_transformer.run_dir import resolve_checkpoint

        try:
            checkpoint = resolve_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
            print(f"checkpoint: {checkpoint}", file=sys.stderr, flush=True)
            results = translate_with_checkpoint(
                FLAGS.model_dir,
                sources,
                FLAGS.batch_size,
                request,
                DecodeOptions.for_run(FLAGS.model_dir, constrained=constrain),
                progress=progress,
                checkpoint=checkpoint,
            )
        except (FileNotFoundError, ValueError) as error:
            raise app.UsageError(str(error)) from None
        hypotheses = [hyps[0][0] for hyps in results]
    print(file=sys.stderr)
    if FLAGS.output:
        from tf_transformer.files import write_bytes

        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
        shown = [task.postprocess(source, h) for source, h in zip(sources, hypotheses, strict=True)]
        write_bytes(FLAGS.output, "".join(f"{h}\n" for h in shown).encode("utf-8"))
    result = task.score(sources, hypotheses, references, **metric_options)
    print(task.summary(result), file=sys.stderr)
    print(json.dumps(result))


def run():
    run_main(main)


if __name__ == "__main__":
    run()

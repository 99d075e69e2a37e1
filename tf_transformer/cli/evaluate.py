"""``tft-evaluate``: translate a test set and score it with sacreBLEU and chrF.

    tft-evaluate --model saved_models/multi30k_en_de/1 --src test.en --ref test.de
    tft-evaluate --model_dir runs/m30k --src test.en --ref test.de --lowercase --tokenize 13a

Scores detokenized, cased text by default (sacreBLEU's signature is printed);
``--lowercase --tokenize 13a`` matches how most published tokenized BLEU is
computed. The last line is one JSON object with bleu, chrf, signature, sentences.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from tf_transformer.cli import check_model_flags, run_main

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Exported SavedModel directory.")
flags.DEFINE_string("model_dir", None, "Or a training run directory (its averaged or newest checkpoint).")
flags.DEFINE_string("src", None, "Source sentences, one per line.", required=True)
flags.DEFINE_string("ref", None, "Reference translations, line-aligned with --src.", required=True)
flags.DEFINE_string("output", None, "Write the hypotheses here (default: print none).")
flags.DEFINE_bool("lowercase", False, "Lowercase before BLEU.")
flags.DEFINE_string("tokenize", "13a", "sacreBLEU tokenizer (13a, intl, none, …).")
flags.DEFINE_integer("beam_size", None, "Beam size (--model_dir only).", lower_bound=1)
flags.DEFINE_float("alpha", None, "Length penalty α (--model_dir only).")
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.", lower_bound=1)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    check_model_flags(FLAGS.model, FLAGS.model_dir)
    from pipelines import DataError
    from tf_transformer.evaluation import read_test_set, score
    from tf_transformer.inference.batch_translation import checked_sources, translate_lines, translate_with_checkpoint

    try:
        sources, references = read_test_set(FLAGS.src, FLAGS.ref)  # exists, UTF-8, equal line counts
        if FLAGS.model:  # every line within the export's maximum source length, or the line named
            sources = list(checked_sources(sources, FLAGS.model, FLAGS.src))
    except DataError as error:
        raise app.UsageError(str(error)) from None

    def progress(done, total):
        print(f"\rtranslated {done}/{total}", end="", file=sys.stderr, flush=True)

    if FLAGS.model:
        hypotheses = [text for text, _ in translate_lines(FLAGS.model, sources, FLAGS.batch_size, progress)]
    else:
        from tf_transformer.run_dir import default_checkpoint

        try:
            checkpoint = default_checkpoint(FLAGS.model_dir)
            print(f"checkpoint: {checkpoint}", file=sys.stderr, flush=True)
            from tf_transformer.inference.decode_options import DecodeOptions

            options = DecodeOptions.for_run(FLAGS.model_dir, beam_size=FLAGS.beam_size, alpha=FLAGS.alpha)
            results = translate_with_checkpoint(
                FLAGS.model_dir, sources, FLAGS.batch_size, options, progress=progress, checkpoint=checkpoint
            )
        except (FileNotFoundError, ValueError) as error:
            raise app.UsageError(str(error)) from None
        hypotheses = [hyps[0][0] for hyps in results]
    print(file=sys.stderr)
    if FLAGS.output:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
        with open(FLAGS.output, "w", encoding="utf-8") as handle:
            handle.write("".join(f"{h}\n" for h in hypotheses))
    result = score(hypotheses, references, lowercase=FLAGS.lowercase, tokenize=FLAGS.tokenize)
    print(f"BLEU {result['bleu']:.2f} ({result['signature']})  chrF {result['chrf']:.2f}", file=sys.stderr)
    print(json.dumps(result))


def run():
    run_main(main)


if __name__ == "__main__":
    run()

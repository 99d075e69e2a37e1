"""``tft-translate``: translate lines from stdin with an exported SavedModel.

    tft-translate --model saved_models/multi30k_en_de/1 < in.txt > out.txt
    tft-translate --model_dir runs/m30k --beam_size 8 --alpha 1.0 --nbest 3 < in.txt

Lines are batched by length and written in input order; progress goes to stderr.
"""

from __future__ import annotations

import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Exported SavedModel directory (beam size and α fixed at export).")
flags.DEFINE_string("model_dir", None, "Or a training run directory: decodes its averaged or newest checkpoint.")
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("beam_size", None, "Beam size (--model_dir only; default: the config's, 4).", lower_bound=1)
flags.DEFINE_float("alpha", None, "Length penalty α (--model_dir only; default: the config's, 0.6).")
flags.DEFINE_integer("nbest", 1, "Hypotheses per input (--model_dir only), written 'index<TAB>score<TAB>text'.")
flags.DEFINE_bool("scores", False, "Write 'score<TAB>translation' lines.")


def translate_lines(model_path: str, lines: list[str], batch_size: int = 64, progress=None) -> list[tuple[str, float]]:
    """Translations and scores of ``lines`` (in order) with the SavedModel at ``model_path``."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    serving = tf.saved_model.load(model_path).signatures["serving_default"]
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    results: list[tuple[str, float] | None] = [None] * len(lines)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        outputs = serving(inputs=tf.constant([lines[i] for i in batch]))
        for index, text, score in zip(batch, outputs["translations"].numpy(), outputs["scores"].numpy(), strict=True):
            results[index] = (text.decode("utf-8"), float(score))
        if progress:
            progress(min(start + batch_size, len(lines)), len(lines))
    return results


def translate_with_checkpoint(model_dir, lines, batch_size, beam_size, alpha, nbest, progress=None):
    """n-best ``[(text, score), …]`` per line from a run's checkpoint, any beam size and α."""
    import tensorflow as tf

    from pipelines import Tokenizer
    from tf_transformer.export import default_checkpoint
    from tf_transformer.training.trainer import restore_model
    from tf_transformer.translator import Translator

    model, config = restore_model(model_dir, default_checkpoint(model_dir))
    beam_size = beam_size or config.beam_size
    if nbest > beam_size:
        raise app.UsageError(f"--nbest {nbest} exceeds --beam_size {beam_size}")
    translator = Translator(
        model,
        Tokenizer(f"{model_dir}/sp.model"),
        beam_size=beam_size,
        alpha=config.length_penalty if alpha is None else alpha,
        extra_length=config.extra_decode_length,
    )
    run = tf.function(lambda texts: translator.translate(texts, nbest=nbest), reduce_retracing=True)
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    results = [None] * len(lines)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        outputs = run(tf.constant([lines[i] for i in batch]))
        texts = outputs["translations"].numpy().reshape(len(batch), nbest)
        scores = outputs["scores"].numpy().reshape(len(batch), nbest)
        for row, index in enumerate(batch):
            results[index] = [(t.decode("utf-8"), float(s)) for t, s in zip(texts[row], scores[row], strict=True)]
        if progress:
            progress(min(start + batch_size, len(lines)), len(lines))
    return results


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if bool(FLAGS.model) == bool(FLAGS.model_dir):
        raise app.UsageError("Give exactly one of --model (an export) or --model_dir (a training run)")
    if FLAGS.model and (FLAGS.beam_size or FLAGS.alpha is not None or FLAGS.nbest != 1):
        raise app.UsageError(
            "--beam_size, --alpha and --nbest are fixed when exporting (tft-export --beam_size/--alpha); "
            "use --model_dir to choose them at translation time"
        )
    lines = [line.rstrip("\r\n") for line in sys.stdin]

    def progress(done, total):
        print(f"\rtranslated {done}/{total}", end="", file=sys.stderr, flush=True)

    if FLAGS.model:
        for text, score in translate_lines(FLAGS.model, lines, FLAGS.batch_size, progress):
            print(f"{score:.4f}\t{text}" if FLAGS.scores else text)
    else:
        results = translate_with_checkpoint(
            FLAGS.model_dir, lines, FLAGS.batch_size, FLAGS.beam_size, FLAGS.alpha, FLAGS.nbest, progress
        )
        for index, hypotheses in enumerate(results):
            for text, score in hypotheses:
                if FLAGS.nbest > 1:
                    print(f"{index}\t{score:.4f}\t{text}")
                else:
                    print(f"{score:.4f}\t{text}" if FLAGS.scores else text)
    print(file=sys.stderr)


def run():
    app.run(main)


if __name__ == "__main__":
    run()

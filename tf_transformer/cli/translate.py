"""``tft-translate``: translate lines from stdin with an exported SavedModel.

    tft-translate --model saved_models/multi30k_en_de/1 < in.txt > out.txt

Lines are batched by length and written in input order; progress goes to stderr.
"""

from __future__ import annotations

import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Exported SavedModel directory.", required=True)
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.", lower_bound=1)
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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    lines = [line.rstrip("\r\n") for line in sys.stdin]

    def progress(done, total):
        print(f"\rtranslated {done}/{total}", end="", file=sys.stderr, flush=True)

    for text, score in translate_lines(FLAGS.model, lines, FLAGS.batch_size, progress):
        print(f"{score:.4f}\t{text}" if FLAGS.scores else text)
    print(file=sys.stderr)


def run():
    app.run(main)


if __name__ == "__main__":
    run()

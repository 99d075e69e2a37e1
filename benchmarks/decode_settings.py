"""Beam size and length penalty α chosen on a validation set: BLEU beside the length ratio (a benchmark).

    python -m benchmarks.decode_settings --model_dir runs/multi30k_en_de \
        --checkpoint runs/multi30k_en_de/averaged/ckpt --grid 4:0.6,4:1.0,4:2.0,5:2.0

Section 6.1 chose "beam size of 4 and length penalty α = 0.6" on newstest2013 for WMT; a
model trained on other data, at another size, may want other values. For each
``beam:alpha`` of ``--grid`` the run's checkpoint translates ``--set`` (the validation
split, never a test set: test sets are scored once, for the final choice) and prints
sacreBLEU, the Moses-tokenized BLEU of the Multi30k papers and the length ratio of each
(hypothesis ÷ reference tokens): a setting that only lengthens outputs shows it there.
The corpora are ``../shared/data``; without them it says so and stops. The last line is
one JSON object with every row and the best row by ``--metric``.
"""

from __future__ import annotations

import json
import time

from absl import app, flags

from benchmarks import skipped_without, start_tensorflow

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Run directory (tft-train output); only read.")
flags.DEFINE_string("checkpoint", None, "Checkpoint prefix (default: the run's newest checkpoint).")
flags.DEFINE_string("set", "../shared/data/multi30k/val", "Validation set: path prefix of the .SRC and .TGT files.")
flags.DEFINE_string("src", "en", "Source language suffix.")
flags.DEFINE_string("tgt", "de", "Target language suffix.")
flags.DEFINE_list("grid", ["4:0.6", "4:1.0", "4:1.4", "4:2.0", "5:2.0", "4:3.0"], "beam:alpha pairs to score.")
flags.DEFINE_string("metric", "bleu", "The key of tf_transformer.bleu.score's result that chooses the best row.")
flags.DEFINE_integer("batch", 64, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("threads", 2, "TensorFlow's intra- and inter-op threads.", lower_bound=1)
flags.mark_flag_as_required("model_dir")


def parse_grid(grid: list[str]) -> list[tuple[int, float]]:
    """``["4:0.6", "5:2"]`` → ``[(4, 0.6), (5, 2.0)]``; a malformed pair is a usage error naming it."""
    pairs = []
    for item in grid:
        try:
            beam, alpha = item.split(":")
            pairs.append((int(beam), float(alpha)))
        except ValueError:
            raise app.UsageError(f"--grid {item!r}: expected BEAM:ALPHA, e.g. 4:0.6") from None
    return pairs


def main(argv):
    del argv
    grid = parse_grid(FLAGS.grid)
    files = (f"{FLAGS.set}.{FLAGS.src}", f"{FLAGS.set}.{FLAGS.tgt}")
    if skipped_without("decode_settings", files):
        return
    tf = start_tensorflow(FLAGS.threads)
    from benchmarks.common import machine
    from tf_transformer.bleu import read_test_set, score
    from tf_transformer.decoding.request import DecodeRequest
    from tf_transformer.inference.batch_translation import translate_with_checkpoint

    sources, references = read_test_set(*files)
    rows = []
    for beam_size, alpha in grid:
        request = DecodeRequest(beam_size=beam_size, alpha=alpha)
        start = time.perf_counter()
        nbests = translate_with_checkpoint(FLAGS.model_dir, sources, FLAGS.batch, request, checkpoint=FLAGS.checkpoint)
        hypotheses = [nbest[0][0] for nbest in nbests]
        row = {"beam_size": beam_size, "alpha": alpha, **score(hypotheses, references, language=FLAGS.tgt)}
        row["seconds"] = round(time.perf_counter() - start, 1)
        for key in ("signature", "chrf_signature", "sentences"):
            row.pop(key)
        print(json.dumps(row), flush=True)
        rows.append(row)
    best = max(rows, key=lambda row: row[FLAGS.metric])
    print(
        json.dumps(
            {
                "benchmark": "decode_settings",
                "model_dir": FLAGS.model_dir,
                "checkpoint": FLAGS.checkpoint,
                "set": FLAGS.set,
                "sentences": len(sources),
                "rows": rows,
                "best": {key: best[key] for key in ("beam_size", "alpha", FLAGS.metric)},
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

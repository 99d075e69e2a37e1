"""``tft-score``: the model's log-probability of given targets (teacher-forced; no search).

    tft-score --model saved_models/multi30k_en_de/1 --src test.en --tgt test.de > scores.tsv
    tft-score --model_dir runs/m30k --src test.en --tgt test.de --alpha 0.6 --token_scores
    tft-score --model saved_models/ptb/1 --tgt dev.mrg          # a parser: gold trees, their words as sources

Writes one line per pair, in input order: ``score<TAB>log_prob<TAB>length``, where
``log_prob`` is ``log p(target | source)`` summed over the target's tokens (EOS
included), ``length`` counts them (EOS included) and ``score`` is ``log_prob``
divided by GNMT's length penalty ``((5 + length) / 6) ** alpha``: the score beam
search gives a finished hypothesis (docs/inference.md#scoring). ``--token_scores``
adds each token's log-probability, space-separated. For a parser, ``--tgt`` holds
gold trees (``.mrg`` or one bracketed tree per line), scored as their linearization.
"""

from __future__ import annotations

import sys

from absl import app, flags

from tf_transformer.cli import run_main
from tf_transformer.cli.flag_groups import (
    check_model_flags,
    decode_request,
    define_batch_flags,
    define_decoding_flags,
    define_model_flags,
)

FLAGS = flags.FLAGS
define_model_flags(
    "Exported SavedModel directory (its score signature).",
    "Or a training run directory (its averaged or newest checkpoint).",
)
flags.DEFINE_string("src", None, "Source sentences, one per line (a parser: default, the words of --tgt's trees).")
flags.DEFINE_string("tgt", None, "Targets, line-aligned with --src (a parser: trees).", required=True)
define_decoding_flags(("alpha",), " of the score column")
flags.DEFINE_bool("token_scores", False, "Add a column of each target token's log-probability.")
define_batch_flags(what="Pairs")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    request = decode_request(allow_with_model=("alpha",))  # scores are normalized here, with any α
    check_model_flags()
    from tf_transformer.cli import model_task, read_test_set
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.inference import batch_scoring

    task = model_task(FLAGS.model, FLAGS.model_dir)
    sources, references = read_test_set(task, FLAGS.model, FLAGS.src, FLAGS.tgt, "--tgt")
    pairs = [(source, task.target_text(reference)) for source, reference in zip(sources, references, strict=True)]
    try:
        if FLAGS.model:
            from tf_transformer.exporting.export_info import read_export_info

            scorer = batch_scoring.export_scorer(FLAGS.model)
            recorded = read_export_info(FLAGS.model).options
        else:
            from tf_transformer.run_dir import resolve_checkpoint

            checkpoint = resolve_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
            print(f"checkpoint: {checkpoint}", file=sys.stderr, flush=True)
            scorer = batch_scoring.checkpoint_scorer(FLAGS.model_dir, checkpoint)
            recorded = DecodeOptions.for_run(FLAGS.model_dir)
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    alpha = request.resolved(recorded).alpha

    def progress(done, total):
        print(f"\rscored {done}/{total}", end="", file=sys.stderr, flush=True)

    try:
        scores = batch_scoring.score_pairs(scorer, pairs, FLAGS.batch_size, progress)
    except Exception as error:
        from tf_transformer.exporting.export_info import graph_error

        if "longer than this model" in str(error):  # a target too long for the model
            raise app.UsageError(graph_error(error)) from None
        raise
    print(file=sys.stderr)
    for score in scores:
        columns = [f"{score.normalized(alpha):.4f}", f"{score.log_prob:.4f}", str(score.length)]
        if FLAGS.token_scores:
            columns.append(" ".join(f"{value:.4f}" for value in score.token_log_probs))
        print("\t".join(columns))


def run():
    run_main(main)


if __name__ == "__main__":
    run()

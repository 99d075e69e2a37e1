"""``tft-attention``: translate sentences and draw what the attention heads attend to (figures 3–5).

    tft-attention --model_dir runs/multi30k_en_de --sentence "A dog runs on the beach ." --output figures/
    tft-attention --model_dir runs/multi30k_en_de --input sentences.txt --output figures/ --words --layer 1
    tft-attention --model saved_models/multi30k_en_de/1 --sentence "A dog runs." --output figures/

Each sentence gets a directory ``sentence_N`` (N from 1) holding PNG figures and
``attention.json`` (the translation, the tokens, which layer, token and heads the
paper-style figures show). With ``--model_dir`` every layer and head is drawn;
an export holds only what its ``translate_with_alignment`` signature returns
(one decoder layer's encoder–decoder attention, heads averaged).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from configs.decoding import SEARCH_SETTINGS
from tf_transformer.cli import run_main
from tf_transformer.cli.flag_groups import check_model_flags, decode_request, define_decoding_flags, define_model_flags

FLAGS = flags.FLAGS
define_model_flags(
    "Or an export's version directory: its translate_with_alignment signature only.",
    "A training run directory: every layer and head (its averaged or newest checkpoint).",
)
flags.DEFINE_string("sentence", None, "One source sentence.")
flags.DEFINE_string("input", None, "Or a file of source sentences, one a line.")
flags.DEFINE_string("output", None, "Directory the figures go to (made if missing).")
flags.DEFINE_integer(
    "layer",
    None,
    "Encoder layer (from 0) of the paper-style figures 3-5 (default: the penultimate, as the paper's "
    "layer 5 of 6). The heatmaps show every layer.",
    lower_bound=0,
)
flags.DEFINE_string(
    "token",
    None,
    "The token figures 3-4 follow, in every sentence: its index, or its text when not a number (default: the word "
    "whose attention reaches farthest).",
)
flags.DEFINE_list("heads", None, "The two heads of figure 4, e.g. 4,5 (default: the two sharpest from the token).")
flags.DEFINE_bool(
    "words", False, "Merge pieces into words: keys summed over a word's pieces, queries averaged (said in each title)."
)
define_decoding_flags(("beam_size", "alpha"), " (--model_dir only)")
flags.DEFINE_integer("max_sentences", 20, "Refuse inputs of more sentences (each gets a dozen figures).", lower_bound=1)


def _sentences() -> list[str]:
    from pipelines import read_lines

    if bool(FLAGS.sentence) == bool(FLAGS.input):
        raise app.UsageError("Give exactly one of --sentence or --input")
    if FLAGS.sentence:
        return [FLAGS.sentence]
    lines = list(read_lines(FLAGS.input))
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise app.UsageError(f"--input {FLAGS.input}:{number}: an empty line has no attention to draw")
    if not lines:
        raise app.UsageError(f"--input {FLAGS.input}: no sentences")
    if len(lines) > FLAGS.max_sentences:
        raise app.UsageError(
            f"--input {FLAGS.input}: {len(lines)} sentences, more than --max_sentences {FLAGS.max_sentences}"
        )
    return lines


def _heads() -> tuple[int, int] | None:
    if FLAGS.heads is None:
        return None
    if len(FLAGS.heads) != 2 or not all(head.isdigit() for head in FLAGS.heads):
        raise app.UsageError(f"--heads {','.join(FLAGS.heads)}: give two head numbers, e.g. --heads 4,5")
    return int(FLAGS.heads[0]), int(FLAGS.heads[1])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    request = decode_request(allow_with_model=SEARCH_SETTINGS)  # refused with --model below, with the others
    if FLAGS.model and any(
        value is not None
        for value in (FLAGS.checkpoint, FLAGS.layer, FLAGS.token, FLAGS.heads, FLAGS.beam_size, FLAGS.alpha)
    ):
        raise app.UsageError(
            "--checkpoint, --layer, --token, --heads, --beam_size and --alpha need --model_dir: an export holds "
            "one layer's attention, heads averaged, with its search fixed at export"
        )
    check_model_flags()
    if not FLAGS.output:
        raise app.UsageError("--output DIR is required")
    sentences = _sentences()
    heads = _heads()
    from tf_transformer.attention_views import report

    # Every sentence is translated and checked (--layer, --token, --heads) before the first figure is drawn,
    # and each sentence's attention.json is written with its figures: a failure leaves no half-drawn sentence.
    try:
        if FLAGS.model:
            layer, results = report.export_attention(FLAGS.model, sentences)
            draws = [
                (
                    result["source"],
                    result["translation"],
                    lambda d, r=result: report.write_export_figure(r, layer, d, FLAGS.words),
                )
                for result in results
            ]
        else:
            from tf_transformer.attention_views.maps import penultimate
            from tf_transformer.run_dir import load_run

            config, _ = load_run(FLAGS.model_dir)
            layer = penultimate(config.num_layers) if FLAGS.layer is None else FLAGS.layer
            if layer >= config.num_layers:
                raise ValueError(f"--layer {layer}: the model has layers 0 to {config.num_layers - 1}")
            results = report.run_attention(FLAGS.model_dir, sentences, FLAGS.checkpoint, request)
            results = [
                (source, translation, maps.words() if FLAGS.words else maps) for source, translation, maps in results
            ]
            for _, _, maps in results:
                report.choose(maps, layer, FLAGS.token, heads)
            draws = [
                (source, translation, lambda d, m=maps: report.write_figures(m, d, layer, FLAGS.token, heads))
                for source, translation, maps in results
            ]
        for number, (source, translation, draw) in enumerate(draws, start=1):
            directory = os.path.join(FLAGS.output, f"sentence_{number}")
            info = draw(directory)
            with open(os.path.join(directory, "attention.json"), "w", encoding="utf-8") as handle:
                json.dump({"source": source, "translation": translation, **info}, handle, indent=2, ensure_ascii=False)
            print(f"{directory}: {len(info['figures'])} figures · {translation}", file=sys.stderr)
    except (ValueError, FileNotFoundError) as error:
        raise app.UsageError(str(error)) from None
    print(json.dumps({"output": FLAGS.output, "sentences": len(draws)}))


def run():
    run_main(main)


if __name__ == "__main__":
    run()

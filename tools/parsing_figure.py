"""Draws one dev tree and a parser's tree over its words (docs/parsing.md's example).

    .venv/bin/python tools/parsing_figure.py --model_dir runs/parsing_words \\
        --checkpoint runs/parsing_words/averaged_3/ckpt --tree 62 --output docs/images/parsing_example.png

The sentence is tree ``--tree`` (from 1) of the ``--files`` range under
``--data``; the parse is the run's decoding (its beam, α and length limit),
repaired as every output is (``linearization.repair``). The figure holds the
gold tree above the parse, each titled with its EVALB F1 against the gold.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="A parsing run directory.")
    parser.add_argument("--checkpoint", help="Checkpoint prefix (default: the run's latest).")
    parser.add_argument("--data", default="../shared/data/ptb_sample/mrg", help="Directory of .mrg files.")
    parser.add_argument("--files", default="wsj_0160-wsj_0179", help="File range the tree is taken from.")
    parser.add_argument("--tree", type=int, default=1, help="Which tree of the range, counted from 1.")
    parser.add_argument("--output", required=True, help="Image file (.png, .svg).")
    args = parser.parse_args()

    from tf_transformer.inference.batch_translation import translate_with_checkpoint
    from tf_transformer.tasks import task_of_run
    from tf_transformer.tasks.parsing.figure import tree_figure
    from tf_transformer.tasks.parsing.linearization import repair
    from tf_transformer.tasks.parsing.task import score_outputs
    from tf_transformer.tasks.parsing.treebank import read_range

    trees = read_range(args.data, args.files)
    if not 1 <= args.tree <= len(trees):
        raise SystemExit(f"--tree must be within 1..{len(trees)} ({args.files} holds {len(trees)} trees)")
    gold = trees[args.tree - 1]
    words = " ".join(gold.leaves())
    task = task_of_run(args.model_dir)
    [[(output, _)]] = translate_with_checkpoint(args.model_dir, [words], 1, checkpoint=args.checkpoint)
    parse, _ = repair(output.split(), words.split(), task.linearization)
    score = score_outputs([words], [output], [gold], task.linearization)  # as the benchmark scores every tree
    figure = tree_figure(
        [gold, parse],
        [
            f"{args.files} tree {args.tree}, the treebank's (cleaned)",
            f"the parser's (F1 {score['f1']:.1f}; {'well-formed' if score['well_formed'] else 'repaired'})",
        ],
    )
    figure.savefig(args.output, dpi=110)
    print(f"{args.output}: F1 {score['f1']:.2f}, {len(gold.leaves())} words")


if __name__ == "__main__":
    main()

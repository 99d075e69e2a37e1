"""Constituency parsing in a fixed CPU time budget (section 6.3; a benchmark, not a test).

    python -m benchmarks.parsing --data ../shared/data/ptb_sample/mrg --minutes 40

Trains the ``parsing_cpu`` preset (``--config``, ``--set``, ``--linearization``,
``--vocab_size``) on ``--train_files`` for at most ``--minutes`` of wall-clock
time, vocabulary and data preparation included (or ``--train_steps`` updates,
for comparisons that other work on the machine must not change), scoring ``--tune_files`` (a
split carved from the treebank's training files) each epoch. Then it picks on
the tune split how many of the last checkpoints to average, decoding with the
paper's parsing settings (beam 21, α 0.3, outputs up to input + 300: the
preset's) under the tree constraint (docs/parsing.md#constrained-decoding),
and scores ``--dev_files`` once with that model, constrained and unconstrained
(repaired), beside the right-branching baseline (``evalb.right_branching``:
root ``S``, every other bracket ``NP``). ``--decode_only`` skips training and
decodes the checkpoints of an existing ``--model_dir``.

The last line of output is one JSON object: ``dev_f1``, ``precision``,
``recall``, ``exact_match``, ``well_formed`` (the share of outputs that were
trees over the input words before repair) and ``repairs`` of the constrained
search, the same under ``unconstrained``, the tune split's F1 by averaged
count, ``train_minutes`` and ``params``.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("data", "../shared/data/ptb_sample/mrg", "Directory of Penn Treebank .mrg files.")
flags.DEFINE_string("train_files", "wsj_0001-wsj_0139", "Training files (a range of names).")
flags.DEFINE_string(
    "tune_files", "wsj_0140-wsj_0159", "Tune files (carved from training): validation and the averaging choice."
)
flags.DEFINE_string("dev_files", "wsj_0160-wsj_0179", "Dev files: scored once, with the model chosen on tune.")
flags.DEFINE_bool("decode_only", False, "Decode the checkpoints of an existing --model_dir without training.")
flags.DEFINE_string("config", "parsing_cpu", "Preset.")
flags.DEFINE_multi_string("set", [], "Config overrides, e.g. --set dropout=0.2.")
flags.DEFINE_enum("linearization", None, ["xx", "tags", "words"], "Trees as target symbols (default: the task's).")
flags.DEFINE_enum("tree_loss", None, ["allowed", "unforced", "full"], "A parser's loss (default: the task's).")
flags.DEFINE_enum("closings", None, ["labeled", "bare"], "Closing brackets )NP or ) (default: the task's).")
flags.DEFINE_integer("vocab_size", None, "SentencePiece vocabulary of the words (default: the preset's).")
flags.DEFINE_integer("tokens_per_batch", None, "Tokens per batch and side (default: the preset's).")
flags.DEFINE_float("minutes", 40.0, "Wall-clock training budget, vocabulary and data preparation included.")
flags.DEFINE_integer(
    "train_steps", None, "Stop after this many updates as well (comparisons that contention must not change)."
)
flags.DEFINE_integer("checkpoint_every", 200, "Checkpoint interval in steps.")
flags.DEFINE_list("average", ["1", "3", "5", "8"], "Numbers of last checkpoints to try averaging (chosen on dev).")
flags.DEFINE_string("precision", "auto", "Training precision (auto: bfloat16 where the CPU computes in it).")
flags.DEFINE_string("model_dir", None, "Run directory (default: runs/parsing_<linearization>).")
flags.DEFINE_integer("seed", 1, "Seed.")


def main(argv):
    del argv
    import tensorflow as tf

    from benchmarks.common import machine
    from configs import RunOptions, get_config, parse_overrides
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.inference.batch_translation import translate_with_checkpoint
    from tf_transformer.run_dir import load_run
    from tf_transformer.tasks import get_task
    from tf_transformer.tasks.parsing.evalb import right_branching, score
    from tf_transformer.tasks.parsing.task import score_outputs
    from tf_transformer.tasks.parsing.treebank import read_range
    from tf_transformer.training.averaging import choose_averaging
    from tf_transformer.training.options import effective
    from tf_transformer.training.trainer import train

    logging.set_verbosity(logging.WARNING)
    linearization = get_task("parsing", FLAGS.linearization).linearization
    model_dir = FLAGS.model_dir or f"runs/parsing_{linearization}"
    if tf.io.gfile.exists(model_dir) != FLAGS.decode_only:
        raise SystemExit(
            f"{model_dir} does not exist: --decode_only decodes an existing run"
            if FLAGS.decode_only
            else f"{model_dir} exists: a budgeted run must start fresh (remove it, pass --model_dir or --decode_only)"
        )
    if not os.path.isdir(FLAGS.data):
        raise SystemExit(f"{FLAGS.data} not found: see ../shared/data/README.md")
    overrides = parse_overrides(FLAGS.set)
    given = {name: FLAGS[name].value for name in ("tokens_per_batch", "vocab_size") if FLAGS[name].value is not None}
    # Without --train_steps, a million updates: the time budget ends the run.
    config = get_config(FLAGS.config, **{"train_steps": FLAGS.train_steps or 1_000_000, **overrides, **given})
    config = config.replace(**{k: v for k, v in get_task("parsing").decoding.items() if k not in overrides})
    start = time.perf_counter()
    options = RunOptions(
        data=FLAGS.data,
        task="parsing",
        linearization=linearization,
        tree_loss=FLAGS.tree_loss,
        closings=FLAGS.closings,
        train_split=FLAGS.train_files,
        dev_split=FLAGS.tune_files,
        max_minutes=FLAGS.minutes - 0.5,  # the last epoch's validation and checkpoint fit in the rest
        checkpoint_every=FLAGS.checkpoint_every,
        keep_checkpoints=max(int(n) for n in FLAGS.average),
        precision=FLAGS.precision,
        dev_bleu_sentences=50,  # tune F1 each epoch on the first 50 tune trees, by greedy search
        attention_images=2,
        seed=FLAGS.seed,
        verbose=2,
    )
    if FLAGS.decode_only:  # what training recorded; its minutes then count the training steps only
        with tf.io.gfile.GFile(os.path.join(model_dir, "train_summary.json")) as handle:
            summary = json.load(handle)
        wall = summary["train_seconds"]
    else:
        summary = train(config, options, model_dir, budget_start=start)
        wall = time.perf_counter() - start

    def decode(files: str, checkpoint, constrained: bool = True):
        gold = read_range(FLAGS.data, files)
        sources = [" ".join(tree.leaves()) for tree in gold]
        decoding = DecodeOptions.for_run(model_dir, constrained=constrained)
        start = time.perf_counter()
        nbests = translate_with_checkpoint(model_dir, sources, 32, options=decoding, checkpoint=checkpoint)
        result = score_outputs(sources, [nbest[0][0] for nbest in nbests], gold, linearization)
        return {**result, "decode_seconds": round(time.perf_counter() - start, 1)}

    best, tune_scores = choose_averaging(
        model_dir, FLAGS.average, lambda c: decode(FLAGS.tune_files, c), "f1", report=print
    )
    checkpoint = tune_scores[best][1]
    dev = decode(FLAGS.dev_files, checkpoint)
    free = decode(FLAGS.dev_files, checkpoint, constrained=False)
    gold = read_range(FLAGS.data, FLAGS.dev_files)
    trained = effective(*load_run(model_dir))
    baseline = score(gold, [right_branching(tree.leaves(), [tag for _, tag in tree.pos()]) for tree in gold])
    epochs = summary["steps"] / summary["steps_per_epoch"]
    print(
        json.dumps(
            {
                "dev_f1": dev["f1"],
                "precision": dev["precision"],
                "recall": dev["recall"],
                "exact_match": dev["exact_match"],
                "well_formed": dev["well_formed"],
                "repairs": dev["repairs"],
                "sentences": dev["sentences"],
                "dev_decode_seconds": dev["decode_seconds"],
                "unconstrained": {
                    key: free[key]
                    for key in ("f1", "precision", "recall", "exact_match", "well_formed", "repairs", "decode_seconds")
                },
                "tune_f1_by_averaged": {str(n): s["f1"] for n, (s, _, _) in tune_scores.items()},
                "averaged": best,
                "right_branching_f1": round(baseline.f1, 2),
                "splits": {"train": FLAGS.train_files, "tune": FLAGS.tune_files, "dev": FLAGS.dev_files},
                "train_minutes": round(wall / 60, 2),
                "steps": summary["steps"],
                "epochs": round(epochs, 2),
                "params": summary["params"],
                "config": config.name,
                "overrides": FLAGS.set,
                "linearization": linearization,
                **{name: trained[name] for name in ("tree_loss", "closings")},  # as the run recorded them
                "vocab_size": config.vocab_size,  # asked: the vocabulary may have fewer pieces
                "beam_size": config.beam_size,
                "alpha": config.alpha,
                "train_precision": summary["precision"],
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

"""Translation quality in a fixed CPU time budget (a benchmark, not a test).

    python -m benchmarks.quality --data ../shared/data/multi30k --src en --tgt de \
        --test test_2016_flickr --key test2016 --minutes 40
    benchmarks/multi30k.sh en de      # the same run, the way docs/benchmarks.md reports it

Trains a preset (the recipe: ``--config``, ``--set``, ``--tokens_per_batch``,
``--vocab_size``) for at most ``--minutes`` of wall-clock time, then picks on
the dev split alone how many of the last checkpoints to average (beam search,
the paper's α), exports that model and decodes the test split through the
export. The last line of output is one JSON object with ``sacrebleu_<key>``
(cased, detokenized), ``lc_tok_bleu_<key>`` (lowercased, 13a-tokenized, the
measure most papers on Multi30k report), ``chrf_<key>``, the dev scores,
``train_minutes``, ``params`` and ``train_tokens_per_second``.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("data", "../shared/data/multi30k", "Corpus directory ({split}.{src} / {split}.{tgt}).")
flags.DEFINE_string("src", "en", "Source language.")
flags.DEFINE_string("tgt", "de", "Target language.")
flags.DEFINE_string("dev", "val", "Dev split: validation during training and the averaging choice.")
flags.DEFINE_string("test", "test_2016_flickr", "Test split, only for reporting.")
flags.DEFINE_string("key", "test2016", "Suffix of the test scores' JSON keys.")
flags.DEFINE_string("config", "multi30k_40min", "Preset (the default is the recipe chosen for 40 minutes).")
flags.DEFINE_multi_string("set", [], "Config overrides, e.g. --set dropout=0.2.")
flags.DEFINE_integer("tokens_per_batch", None, "Tokens per batch and side (default: the preset's).")
flags.DEFINE_integer("vocab_size", None, "Shared SentencePiece vocabulary (default: the preset's).")
flags.DEFINE_float("minutes", 40.0, "Wall-clock training budget, vocabulary and data preparation included.")
flags.DEFINE_integer("checkpoint_every", 200, "Checkpoint interval in steps.")
flags.DEFINE_list("average", ["1", "5", "10"], "Numbers of last checkpoints to try averaging (chosen on dev).")
flags.DEFINE_string("precision", "auto", "Training precision (auto: bfloat16 where the CPU computes in it).")
flags.DEFINE_string("model_dir", None, "Run directory (default: runs/quality_<corpus>_<src>_<tgt>).")
flags.DEFINE_integer("seed", 1, "Seed.")
flags.DEFINE_enum("schedule", "paper", ["paper", "budget"], "Learning-rate schedule (docs/training.md).")


def main(argv):
    del argv
    import tensorflow as tf

    from benchmarks.common import machine
    from configs import RunOptions, get_config, parse_overrides
    from tf_transformer.bleu import read_test_set, score
    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.inference.batch_translation import translate_lines, translate_with_checkpoint
    from tf_transformer.training.averaging import choose_averaging
    from tf_transformer.training.trainer import train

    logging.set_verbosity(logging.WARNING)
    corpus = os.path.basename(os.path.normpath(FLAGS.data))
    model_dir = FLAGS.model_dir or f"runs/quality_{corpus}_{FLAGS.src}_{FLAGS.tgt}"
    if tf.io.gfile.exists(model_dir):
        raise SystemExit(f"{model_dir} exists: a budgeted run must start fresh (remove it or pass --model_dir)")
    for split in (FLAGS.dev, FLAGS.test):
        for lang in (FLAGS.src, FLAGS.tgt):
            path = os.path.join(FLAGS.data, f"{split}.{lang}")
            if not os.path.exists(path):
                raise SystemExit(f"{path} not found: see ../shared/data/README.md")
    given = {name: FLAGS[name].value for name in ("tokens_per_batch", "vocab_size") if FLAGS[name].value is not None}
    # A million updates: the time budget ends the run.
    config = get_config(FLAGS.config, **{"train_steps": 1_000_000, **parse_overrides(FLAGS.set), **given})
    # The budget covers everything before the first step too (vocabulary, data
    # cache, graph tracing): the fit-time limit is what is left of it.
    start = time.perf_counter()
    options = RunOptions(
        data=FLAGS.data,
        src=FLAGS.src,
        tgt=FLAGS.tgt,
        dev_split=FLAGS.dev,
        max_minutes=FLAGS.minutes - 0.5,  # the last epoch's validation and checkpoint fit in the rest
        checkpoint_every=FLAGS.checkpoint_every,
        keep_checkpoints=max(int(n) for n in FLAGS.average),
        precision=FLAGS.precision,
        dev_bleu_sentences=100,
        seed=FLAGS.seed,
        schedule=FLAGS.schedule,
        verbose=2,
    )
    summary = train(config, options, model_dir, budget_start=start)
    wall = time.perf_counter() - start
    epochs = summary["steps"] / summary["steps_per_epoch"]
    tokens_per_second = summary["stats"]["target_tokens"] * epochs / summary["train_seconds"]

    dev_src, dev_ref = read_test_set(
        *(os.path.join(FLAGS.data, f"{FLAGS.dev}.{code}") for code in (FLAGS.src, FLAGS.tgt))
    )

    def evaluate(checkpoint):
        nbests = translate_with_checkpoint(model_dir, dev_src, 64, checkpoint=checkpoint)
        return score([nbest[0][0] for nbest in nbests], dev_ref, language=FLAGS.tgt)

    best, dev_scores = choose_averaging(model_dir, FLAGS.average, evaluate, "bleu", report=print)
    dev_result, checkpoint, _ = dev_scores[best]

    export_dir = os.path.join(model_dir, "export", "1")
    export_run(model_dir, export_dir, checkpoint=checkpoint, overwrite=True)
    test_src, test_ref = read_test_set(
        *(os.path.join(FLAGS.data, f"{FLAGS.test}.{code}") for code in (FLAGS.src, FLAGS.tgt))
    )
    decode_start = time.perf_counter()
    hypotheses = [text for text, _ in translate_lines(export_dir, test_src, batch_size=64)]
    decode_seconds = time.perf_counter() - decode_start
    with open(os.path.join(model_dir, f"{FLAGS.test}.hyp.{FLAGS.tgt}"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(hypotheses) + "\n")
    test = score(hypotheses, test_ref, language=FLAGS.tgt)
    key = FLAGS.key
    result = {
        "corpus": corpus,
        "direction": f"{FLAGS.src}-{FLAGS.tgt}",
        f"sacrebleu_{key}": test["bleu"],
        f"lc_tok_bleu_{key}": test["lc_tok_bleu"],
        f"moses_bleu_{key}": test["moses_bleu"],
        f"length_ratio_{key}": test["length_ratio"],
        f"moses_length_ratio_{key}": test["moses_length_ratio"],
        f"chrf_{key}": test["chrf"],
        "signature": test["signature"],
        f"sacrebleu_{FLAGS.dev}": dev_result["bleu"],
        f"chrf_{FLAGS.dev}": dev_result["chrf"],
        f"moses_bleu_{FLAGS.dev}": dev_result["moses_bleu"],
        f"length_ratio_{FLAGS.dev}": dev_result["length_ratio"],
        "alpha": config.alpha,
        "beam_size": config.beam_size,
        "dev_bleu_by_averaged": {str(n): s["bleu"] for n, (s, _, _) in dev_scores.items()},
        "averaged": best,
        "test_decode_seconds": round(decode_seconds, 1),
        "train_minutes": round(wall / 60, 2),
        "steps": summary["steps"],
        "schedule": FLAGS.schedule,
        "schedule_horizon": summary.get("schedule_horizon"),
        "epochs": round(epochs, 2),
        "params": summary["params"],
        "train_tokens_per_second": round(tokens_per_second),
        "config": config.name,
        "overrides": FLAGS.set,
        "tokens_per_batch": config.tokens_per_batch,
        "vocab_size": config.vocab_size,
        "precision": summary["precision"],
        "machine": machine(),
        "tensorflow": tf.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)

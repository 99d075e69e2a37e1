"""The main job (``make demo``): Multi30k EN→DE end to end on a CPU.

Gets the data (shared copy, or a checksummed download), trains the ``multi30k``
preset for a time budget, averages the last checkpoints (how many: chosen on the
validation set, as benchmarks.quality does), exports a SavedModel,
scores test_2016_flickr through the export (sacreBLEU, chrF and the Moses-tokenized
BLEU of the Multi30k papers), and translates three example sentences with it.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Chosen on Multi30k's validation set (docs/training.md#the-multi30k-recipe): the preset. Checkpoints are
# written every 100 updates; how many of the last to average is chosen on the validation set after training,
# from these counts: the updates a time budget buys, and so the span the last n cover, depend on the CPU.
PRESET = "multi30k"
AVERAGE_CANDIDATES = (1, 5, 10)
EXAMPLES = [
    "A man in a blue shirt is riding a bicycle down the street.",
    "Two dogs are playing in the snow.",
    "A little girl is sitting on a bench in the park.",
]


def main() -> int:
    from tf_transformer.cli.startup import start_tensorflow

    start_tensorflow()
    from absl import logging

    from configs import RunOptions, get_config
    from pipelines import DataError
    from pipelines.download import fetch_multi30k
    from tf_transformer.bleu import read_test_set, score
    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.inference.batch_translation import translate_lines, translate_with_checkpoint
    from tf_transformer.training.averaging import average_checkpoints, choose_averaging
    from tf_transformer.training.trainer import train

    logging.set_verbosity(logging.WARNING)
    minutes = float(os.environ.get("DEMO_MINUTES", "18"))
    model_dir = os.environ.get("DEMO_MODEL_DIR", "runs/multi30k_en_de")
    export_dir = os.environ.get("DEMO_EXPORT", "saved_models/multi30k_en_de/1")
    try:
        data = fetch_multi30k()
    except DataError as error:
        print(f"make demo: {error}", file=sys.stderr)
        return 2
    print(f"[1/4] Multi30k EN-DE from {data}", flush=True)
    print(f"[2/4] training '{PRESET}' for up to {minutes:g} minutes in {model_dir}", flush=True)
    print(f"      watch it: .venv/bin/tensorboard --logdir {model_dir}/logs", flush=True)
    options = RunOptions(
        data=data,
        src="en",
        tgt="de",
        dev_split="val",
        max_minutes=minutes,
        checkpoint_every=100,
        keep_checkpoints=max(AVERAGE_CANDIDATES),
        precision="auto",  # mixed_bfloat16 where the CPU computes in bfloat16, else float32 (docs/training.md)
        dev_bleu_sentences=100,
        verbose=2,
    )
    start = time.perf_counter()
    summary = train(get_config(PRESET, train_steps=100_000), options, model_dir)  # the time budget ends it
    print(f"      {summary['steps']} steps in {summary['train_seconds'] / 60:.1f} min", flush=True)
    val_sources, val_references = read_test_set(os.path.join(data, "val.en"), os.path.join(data, "val.de"))

    def val_score(checkpoint):
        nbests = translate_with_checkpoint(model_dir, val_sources, 64, checkpoint=checkpoint)
        return score([nbest[0][0] for nbest in nbests], val_references, language="de")

    last, val_scores = choose_averaging(model_dir, AVERAGE_CANDIDATES, val_score, "bleu")
    # The chosen average becomes the run's current one (model_dir/averaged), which tft-export, tft-translate
    # and the documented benchmark commands load by default: the same mean as averaged_<last>, recomputed.
    averaged = average_checkpoints(model_dir, last=last)
    by_count = ", ".join(f"{n}: {scored['bleu']:.2f}" for n, (scored, _, _) in val_scores.items())
    print(
        f"[3/4] averaging the last {last} checkpoint(s), chosen on val (BLEU by count: {by_count}) → {averaged}; "
        f"exporting {export_dir}",
        flush=True,
    )
    export_run(model_dir, export_dir, checkpoint=averaged, overwrite=True)
    sources, references = read_test_set(
        os.path.join(data, "test_2016_flickr.en"), os.path.join(data, "test_2016_flickr.de")
    )
    decode_start = time.perf_counter()
    hypotheses = [text for text, _ in translate_lines(export_dir, sources, batch_size=64)]
    decode_seconds = time.perf_counter() - decode_start
    result = score(hypotheses, references, language="de")
    print(
        f"[4/4] test_2016_flickr: BLEU {result['bleu']:.2f} ({result['signature']}), chrF {result['chrf']:.2f}, "
        f"Moses-tokenized BLEU of the Multi30k papers {result['moses_bleu']:.2f} (length ratio "
        f"{result['moses_length_ratio']:.3f}); decoded {len(sources)} sentences in {decode_seconds:.0f} s",
        flush=True,
    )
    for source, (translation, _) in zip(EXAMPLES, translate_lines(export_dir, EXAMPLES), strict=True):
        print(f"      EN: {source}\n      DE: {translation}", flush=True)
    result.update(
        {
            "steps": summary["steps"],
            "averaged": last,
            "val_bleu_by_averaged": {str(n): scored["bleu"] for n, (scored, _, _) in val_scores.items()},
            "train_minutes": round(summary["train_seconds"] / 60, 1),
            "total_minutes": round((time.perf_counter() - start) / 60, 1),
            "export": export_dir,
        }
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

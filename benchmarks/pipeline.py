"""Input pipeline benchmark (not a test): padding, shapes, budget and throughput.

    python -m benchmarks.pipeline --data ../shared/data/multi30k --src en --tgt de --tokens_per_batch 25000

Trains a shared SentencePiece vocabulary on the training split, builds the
token-budget pipeline from text (tokenizing and writing the cache), then reads it
back from the cache for several epochs. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import tensorflow as tf
from absl import app, flags, logging

from benchmarks.common import machine
from pipelines import Tokenizer, find_split, train_sentencepiece, training_dataset

FLAGS = flags.FLAGS
flags.DEFINE_string("data", None, "Corpus directory holding {split}.{src} and {split}.{tgt}.", required=True)
flags.DEFINE_string("src", "en", "Source language code.")
flags.DEFINE_string("tgt", "de", "Target language code.")
flags.DEFINE_string("split", "train", "Split to read.")
flags.DEFINE_integer("tokens_per_batch", 25_000, "Global token budget per side.")
flags.DEFINE_integer("vocab_size", 8000, "Shared SentencePiece vocabulary size.")
flags.DEFINE_integer("max_train_length", 256, "Length filter: pairs with a longer side (subwords) are dropped.")
flags.DEFINE_integer("epochs", 3, "Epochs read from the cache (the best is reported).")


def epoch_stats(dataset: tf.data.Dataset) -> dict:
    """Iterates one epoch, reducing each batch to a few numbers inside the pipeline."""

    def summarize(features, labels):
        inputs = features["inputs"]
        return {
            "real": tf.math.count_nonzero(inputs) + tf.math.count_nonzero(labels),
            "target": tf.math.count_nonzero(labels),
            "padded": tf.cast(tf.size(inputs) + tf.size(labels), tf.int64),
            "max_side": tf.cast(tf.maximum(tf.size(inputs), tf.size(labels)), tf.int64),
            "shape": tf.concat([tf.shape(inputs), tf.shape(labels)], 0),
        }

    start = time.perf_counter()
    totals = {"real": 0, "target": 0, "padded": 0, "max_side": 0, "batches": 0}
    shapes = set()
    for batch in dataset.map(summarize):
        totals["real"] += int(batch["real"])
        totals["target"] += int(batch["target"])
        totals["padded"] += int(batch["padded"])
        totals["max_side"] = max(totals["max_side"], int(batch["max_side"]))
        totals["batches"] += 1
        shapes.add(tuple(batch["shape"].numpy()))
    totals["seconds"] = time.perf_counter() - start
    totals["shapes"] = len(shapes)
    return totals


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    corpus = find_split(FLAGS.data, FLAGS.split, FLAGS.src, FLAGS.tgt)
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        model = train_sentencepiece(corpus.pairs(), os.path.join(work, "sp.model"), vocab_size=FLAGS.vocab_size)
        vocab_seconds = time.perf_counter() - start
        tokenizer = Tokenizer(model)
        cache = os.path.join(work, "cache")
        common = dict(
            tokens_per_batch=FLAGS.tokens_per_batch, max_train_length=FLAGS.max_train_length, cache_dir=cache, seed=0
        )

        start = time.perf_counter()
        first = training_dataset(corpus, tokenizer, **common)  # tokenizes and writes the cache
        from_text = epoch_stats(first.dataset)
        from_text_seconds = time.perf_counter() - start

        epochs = [epoch_stats(training_dataset(corpus, tokenizer, **common).dataset) for _ in range(FLAGS.epochs)]
        best = min(epochs, key=lambda e: e["seconds"])
        padded = epoch_stats(training_dataset(corpus, tokenizer, pad_to_bucket_boundary=True, **common).dataset)

    result = {
        "benchmark": "pipeline",
        "data": os.path.normpath(FLAGS.data),
        "src": FLAGS.src,
        "tgt": FLAGS.tgt,
        "tokens_per_batch": FLAGS.tokens_per_batch,
        "vocab_size": tokenizer.vocab_size,
        "pairs_kept": first.stats.kept,
        "pairs_dropped": first.stats.empty + first.stats.too_long,
        "batches_per_epoch": best["batches"],
        "padding_efficiency": round(best["real"] / best["padded"], 4),
        "padding_efficiency_bucket_boundary": round(padded["real"] / padded["padded"], 4),
        "distinct_shapes": padded["shapes"],
        "distinct_shapes_unpadded": best["shapes"],
        "max_batch_tokens": max(best["max_side"], padded["max_side"], from_text["max_side"]),
        "tokens_per_second_from_cache": round(best["target"] / best["seconds"]),
        "tokens_per_second_from_text": round(from_text["target"] / from_text_seconds),
        "vocab_seconds": round(vocab_seconds, 2),
        "machine": machine(),
        "tensorflow": tf.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)

"""Resume benchmark (not a test): time from building the training pipeline to its first batch.

    python -m benchmarks.resume --data ../shared/data/multi30k --src en --tgt de

A resumed run starts the data at the batch its checkpoint reached. For a batch in
the middle of each ``--epoch``, times building the pipeline and getting that batch
with ``TrainingData.starting_at`` (only that epoch is read) and with ``skip`` over
the stream from its start (every earlier epoch is read, sorted and shuffled again),
and checks that both give the same batch. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np
import tensorflow as tf
from absl import app, flags, logging

from benchmarks.common import machine
from configs import get_config
from pipelines import Tokenizer, find_split, train_sentencepiece, training_dataset

FLAGS = flags.FLAGS
flags.DEFINE_string("data", "../shared/data/multi30k", "Corpus directory holding {split}.{src} and {split}.{tgt}.")
flags.DEFINE_string("src", "en", "Source language code.")
flags.DEFINE_string("tgt", "de", "Target language code.")
flags.DEFINE_string("split", "train", "Split to read.")
flags.DEFINE_string("config", "small", "Preset whose tokens per batch, length filter and vocabulary size are used.")
flags.DEFINE_integer("tokens_per_batch", None, "Global token budget per side (default: the preset's).")
flags.DEFINE_multi_integer("epoch", [1, 20], "Epochs (counted from 0) to resume in, at their middle batch.")
flags.DEFINE_integer("repeats", 2, "Timings per setting (the best is reported).")
flags.DEFINE_bool("skip", True, "Also time `skip` over the stream from its start (the old way).")


def first_batch_seconds(build, start: int, new: bool) -> tuple[float, tuple]:
    """Seconds from building the pipeline to holding batch ``start``, and that batch."""
    begin = time.perf_counter()
    data = build()
    dataset = data.starting_at(start) if new else data.dataset.skip(start)
    features, labels = next(iter(dataset))
    batch = (features["inputs"].numpy(), features["targets"].numpy(), labels.numpy())
    return time.perf_counter() - begin, batch


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    given = {"tokens_per_batch": FLAGS.tokens_per_batch} if FLAGS.tokens_per_batch else {}
    config = get_config(FLAGS.config, **given)
    tokens, max_length = config.tokens_per_batch, config.max_train_length
    corpus = find_split(FLAGS.data, FLAGS.split, FLAGS.src, FLAGS.tgt)
    with tempfile.TemporaryDirectory() as work:
        model = train_sentencepiece(corpus.pairs(), os.path.join(work, "sp.model"), vocab_size=config.vocab_size)
        tokenizer = Tokenizer(model)
        settings = dict(tokens_per_batch=tokens, max_train_length=max_length, seed=1, deterministic=True, repeat=True)

        def build():
            return training_dataset(corpus, tokenizer, cache_dir=os.path.join(work, "cache"), **settings)

        data = build()  # tokenizes and writes the cache, as the first run did
        per_epoch = data.batches_per_epoch
        target_tokens = sum(int(tf.math.count_nonzero(labels)) for _, labels in data.dataset.take(per_epoch))
        results = {}
        for epoch in FLAGS.epoch:
            start = epoch * per_epoch + per_epoch // 2
            row = {"start_batch": start}
            for way in ("starting_at", "skip") if FLAGS.skip else ("starting_at",):
                timings = [first_batch_seconds(build, start, way == "starting_at") for _ in range(FLAGS.repeats)]
                row[f"{way}_seconds"] = round(min(seconds for seconds, _ in timings), 2)
                row[f"{way}_batch"] = timings[0][1]
            if FLAGS.skip:
                row["same_batch"] = all(
                    np.array_equal(a, b) for a, b in zip(row["starting_at_batch"], row["skip_batch"], strict=True)
                )
            for way in ("starting_at", "skip"):
                row.pop(f"{way}_batch", None)
            print(json.dumps({f"epoch_{epoch}": row}), flush=True)
            results[f"epoch_{epoch}"] = row

    result = {
        "benchmark": "resume",
        "data": os.path.normpath(FLAGS.data),
        "src": FLAGS.src,
        "tgt": FLAGS.tgt,
        "config": FLAGS.config,
        "tokens": tokens,
        "max_length": max_length,
        "vocab_size": tokenizer.vocab_size,
        "pairs_kept": data.stats.kept,
        "batches_per_epoch": per_epoch,
        "target_tokens_per_batch": round(target_tokens / per_epoch, 1),
        "results": results,
        "machine": machine(),
        "tensorflow": tf.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)

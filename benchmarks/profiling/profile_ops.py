"""Where the time goes: a TensorBoard profile of decoding or training (a tool, not a test).

    python -m benchmarks.profiling.profile_ops --mode decode --config base --logdir runs/profile/decode_base
    python -m benchmarks.profiling.profile_ops --mode train --config base --precision mixed_bfloat16 \
        --logdir runs/profile/train
    tensorboard --logdir runs/profile/decode_base     # Profile tab (pip install tensorboard-plugin-profile)

``decode``: ``--batches`` batches of newstest2013 through cached beam search (beam 4,
batch 32, output forced to ``--output_tokens`` tokens, untrained weights).
``train``: ``fit`` steps on one fixed batch (``--train_batch`` × ``--src_len`` /
``--tgt_len`` tokens, as in ``benchmarks.peers``). Runs under the TensorFlow profiler
and prints the op types that took the most self time (summed over threads, so shares
are of op time, not of wall clock), then one JSON line with the speed measured outside
the profiler.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import statistics
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags
from tensorflow.tsl.profiler.protobuf import xplane_pb2

import pipelines
from benchmarks.common import StepTimer, source_batches, timed
from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.inference.translator import Translator
from tf_transformer.training.trainer import compile_model

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "decode", ["decode", "train"], "What to profile.")
flags.DEFINE_string("data", "../shared/data/newstest/newstest2013.en", "Source sentences, one per line.")
flags.DEFINE_string("config", "base", "Preset.")
flags.DEFINE_string("precision", "float32", "Keras dtype policy of the model.")
flags.DEFINE_string("logdir", "runs/profile/latest", "Where the TensorBoard profile is written.")
flags.DEFINE_integer("batches", 4, "Decoding batches profiled (after one warm-up batch).")
flags.DEFINE_integer("batch", 32, "Sentences per batch.")
flags.DEFINE_integer("beam", 4, "Beam size.")
flags.DEFINE_integer("output_tokens", 40, "Forced output length (EOS included).")
flags.DEFINE_integer("vocab_size", 8000, "SentencePiece vocabulary size.")
flags.DEFINE_integer("threads", 2, "Intra- and inter-op threads.")
flags.DEFINE_integer("top", 25, "Op types listed.")
flags.DEFINE_integer("train_batch", 64, "Training sentences per batch (--mode train).")
flags.DEFINE_integer("src_len", 32, "Training source tokens per sentence.")
flags.DEFINE_integer("tgt_len", 32, "Training target tokens per sentence.")
flags.DEFINE_integer("steps", 5, "Training steps timed, then profiled (after 2 warm-up steps).")


def op_times(logdir: str) -> collections.Counter:
    """Self seconds per op type in the newest profile under ``logdir``, summed over threads.

    Events nest on each thread (the executor's ``Process`` around an op, an XLA
    launch around its kernels): each event is charged its time minus its children's.
    """
    paths = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")), key=os.path.getmtime)
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as handle:
        space.ParseFromString(handle.read())
    totals = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith(("tf_Compute", "tf_numa", "tf_inter")):
                continue
            stack = []  # (end_ps, op type) of the events enclosing the current one
            for event in sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps)):
                while stack and stack[-1][0] <= event.offset_ps:
                    stack.pop()
                name = plane.event_metadata[event.metadata_id].name.strip()
                op_type = name.rsplit(":", 1)[-1]
                seconds = event.duration_ps * 1e-12
                totals[op_type] += seconds
                if stack:
                    totals[stack[-1][1]] -= seconds
                stack.append((event.offset_ps + event.duration_ps, op_type))
    return totals


def _profiled(run) -> float:
    """Wall-clock seconds of ``run()`` under the profiler (trace written to ``--logdir``)."""
    tf.profiler.experimental.start(FLAGS.logdir)
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    tf.profiler.experimental.stop()
    return seconds


def decode_speed() -> tuple[float, float]:
    """(target tokens/s unprofiled, profiled wall seconds) of cached beam search."""
    lines = [line.strip() for line in pipelines.read_lines(FLAGS.data)][: FLAGS.batch * (FLAGS.batches + 1)]
    with tempfile.TemporaryDirectory() as work:
        tokenizer = pipelines.Tokenizer(
            pipelines.train_sentencepiece(
                ((line, line) for line in lines), os.path.join(work, "sp.model"), vocab_size=FLAGS.vocab_size
            )
        )
    batches = source_batches(tokenizer, lines, FLAGS.batch)
    config = get_config(FLAGS.config, vocab_size=tokenizer.vocab_size)
    model = build_transformer(config, dtype=keras.dtype_policies.get(FLAGS.precision))
    translator = Translator(model, tokenizer, DecodeOptions(beam_size=FLAGS.beam))
    search = tf.function(
        lambda x: translator.with_options(min_length=FLAGS.output_tokens, max_output_length=FLAGS.output_tokens).search(
            x
        )[0],
        input_signature=[tf.TensorSpec([None, None], tf.int32)],  # traced once, as in an export
    )
    seconds = timed(lambda x: search(x).numpy(), batches)
    profiled = _profiled(lambda: [search(batch).numpy() for batch in batches[1:]])
    return sum(len(b) for b in batches) * FLAGS.output_tokens / seconds, profiled


def train_speed() -> tuple[float, float]:
    """(target tokens/s unprofiled, profiled wall seconds) of ``fit`` steps."""
    keras.config.set_dtype_policy(FLAGS.precision)
    config = get_config(FLAGS.config, vocab_size=FLAGS.vocab_size)
    model = compile_model(build_transformer(config), config)
    rng = np.random.default_rng(0)
    src = rng.integers(4, FLAGS.vocab_size, (FLAGS.train_batch, FLAGS.src_len)).astype("int32")
    tgt = rng.integers(4, FLAGS.vocab_size, (FLAGS.train_batch, FLAGS.tgt_len)).astype("int32")
    data = tf.data.Dataset.from_tensors(({"inputs": src, "targets": tgt}, tgt)).repeat()
    timer = StepTimer()
    model.fit(data, steps_per_epoch=FLAGS.steps + 2, epochs=1, verbose=0, callbacks=[timer])
    speed = FLAGS.train_batch * FLAGS.tgt_len / statistics.median(timer.times[2:])
    profiled = _profiled(lambda: model.fit(data, steps_per_epoch=FLAGS.steps, epochs=1, verbose=0))
    return speed, profiled


def main(argv):
    del argv
    if FLAGS.mode == "decode" and not os.path.exists(FLAGS.data):
        raise app.UsageError(f"--data {FLAGS.data}: not found (real corpora live in ../shared/data)")
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)
    speed, profiled = decode_speed() if FLAGS.mode == "decode" else train_speed()
    totals = op_times(FLAGS.logdir)
    everything = sum(totals.values())
    print(f"op time {everything:.2f} s over {profiled:.2f} s wall clock (profiled)")
    for op_type, spent in totals.most_common(FLAGS.top):
        print(f"{op_type:40s} {spent:8.3f} s {100 * spent / everything:5.1f} %")
    print(
        json.dumps(
            {
                "benchmark": "profile",
                "mode": FLAGS.mode,
                "config": FLAGS.config,
                "precision": FLAGS.precision,
                "target_tokens_per_second": round(speed, 1),
                "top_ops": {k: round(v / everything, 3) for k, v in totals.most_common(8)},
                "logdir": FLAGS.logdir,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

"""The peers' common workload: its flags, the training batch, the decoding batches, the threads.

Every system measures the same work: one identical training batch, and the same
SentencePiece ids of newstest2013 for decoding, every output forced to
``--output_tokens`` tokens. ``profiling.step_breakdown`` imports these flags to
decode the same workload.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from absl import flags

import pipelines
from benchmarks.common import StepTimer, source_batches

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("size", ["small", "base"], "Presets whose dimensions every system uses.")
flags.DEFINE_list("systems", ["ours", "keras_hub", "hf", "ct2"], "Systems to measure.")
flags.DEFINE_string("data", "../shared/data/newstest/newstest2013.en", "Source sentences for decoding.")
flags.DEFINE_integer("sentences", 512, "Sentences decoded.")
flags.DEFINE_integer("batch", 32, "Sentences per decoding batch.")
flags.DEFINE_integer("beam", 4, "Beam size.")
flags.DEFINE_integer("output_tokens", 40, "Forced output length (decoder steps) for every system.")
flags.DEFINE_integer("vocab_size", 8000, "Shared vocabulary size.")
flags.DEFINE_integer("train_batch", 64, "Training sentences per batch.")
flags.DEFINE_integer("src_len", 32, "Training source tokens per sentence.")
flags.DEFINE_integer("tgt_len", 32, "Training target tokens per sentence.")
flags.DEFINE_integer("steps", 8, "Timed training steps per system (after 2 warm-up steps; the median is reported).")
flags.DEFINE_integer("rounds", 4, "Interleaved rounds the timed training steps are split into.")
flags.DEFINE_integer("threads", 2, "Threads for every system.")
flags.DEFINE_list("parts", ["train", "decode"], "What to measure: train, decode or both.")
flags.DEFINE_integer(
    "batch_parts",
    1,
    "Decode each batch as this many equal parts side by side: ours exported with DecodeOptions(batch_parts=N) and run "
    "with --threads / N intra-op and --threads inter-op threads; CTranslate2 measured both ways (intra_threads = "
    "--threads, and inter_threads = N over the same parts), its faster counting. Needs --parts decode (training "
    "would run with fewer intra-op threads).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "workers",
    1,
    "Decode this many whole batches at once, each on --threads / N intra-op threads (with --batch_parts 1): ours "
    "as concurrent calls of the export's signature, as TF Serving serves concurrent requests; CTranslate2 as "
    "inter_threads = N workers, each batch submitted asynchronously. Also measured: our N-stream export on each "
    "batch's parts, CTranslate2 with intra_threads = --threads and with N workers on each batch's N parts. Hugging "
    "Face decodes the batches one after another. Needs --parts decode.",
    lower_bound=1,
)
flags.DEFINE_enum(
    "hf_bfloat16_train",
    "auto",
    ["auto", "always", "never"],
    "Measure Hugging Face training under bfloat16 autocast: auto = only on CPUs with bfloat16 hardware "
    "(emulated, it ran at 7-61 target tok/s on an AVX2 CPU: about 50 minutes for the base batches alone).",
)

PAD, EOS = pipelines.PAD_ID, pipelines.EOS_ID


# --- decoding ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodingWorkload:
    """What every system decodes, and where it may write its models."""

    batches: list[np.ndarray]  # int32 [--batch, length] source ids, each row EOS-terminated, 0-padded
    tokenizer_path: str  # the SentencePiece model the batches were tokenized with (ours exports it)
    work: str  # a temporary directory for exports and converted models


def decoding_workload(work: str) -> DecodingWorkload:
    """The first ``--sentences`` lines of ``--data`` in batches of ``--batch``, tokenized by a
    ``--vocab_size`` SentencePiece model trained on them (written to ``work``)."""
    lines = [line.strip() for line in pipelines.read_lines(FLAGS.data)][: FLAGS.sentences]
    path = pipelines.train_sentencepiece(
        ((line, line) for line in lines), os.path.join(work, "sp.model"), vocab_size=FLAGS.vocab_size
    )
    return DecodingWorkload(source_batches(pipelines.Tokenizer(path), lines, FLAGS.batch), path, work)


def set_threads() -> None:
    """TensorFlow's threads: ``--threads / (--batch_parts × --workers)`` per op, ``--threads`` ops at once."""
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads // (FLAGS.batch_parts * FLAGS.workers))
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)


def one_after_another(run):
    """``run(i)`` → ``run_group(indices)``: the indices' runs in turn."""
    return lambda group: [run(i) for i in group]


def concurrently(run):
    """``run(i)`` → ``run_group(indices)``: the indices' runs at once, on ``--workers`` threads."""
    if FLAGS.workers == 1:
        return one_after_another(run)
    pool = ThreadPoolExecutor(FLAGS.workers)
    return lambda group: list(pool.map(run, group))


# --- training ----------------------------------------------------------------------------------------


def training_batch() -> tuple[np.ndarray, np.ndarray]:
    """The identical batch every system trains on: random ids, ``--train_batch`` × ``--src_len`` / ``--tgt_len``."""
    rng = np.random.default_rng(0)
    src = rng.integers(4, FLAGS.vocab_size, (FLAGS.train_batch, FLAGS.src_len)).astype("int32")
    tgt = rng.integers(4, FLAGS.vocab_size, (FLAGS.train_batch, FLAGS.tgt_len)).astype("int32")
    return src, tgt


def keras_fit_runner(model):
    """``run(steps)`` → seconds of each of ``steps`` ``fit`` steps on the identical batch (warmed up here)."""
    src, tgt = training_batch()
    data = tf.data.Dataset.from_tensors(({"inputs": src, "targets": tgt}, tgt)).repeat()

    def run(steps: int) -> list[float]:
        timer = StepTimer()
        # One step more, untimed: the first step of a fit call also starts the input iterator.
        model.fit(data, steps_per_epoch=steps + 1, epochs=1, verbose=0, callbacks=[timer])
        return timer.times[1:]

    run(2)  # tracing and first steps
    return run

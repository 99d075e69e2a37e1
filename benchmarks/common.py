"""Helpers shared by the benchmark scripts (no flags here: each script defines its own)."""

from __future__ import annotations

import os
import platform
import time

import keras
import numpy as np
import tensorflow as tf

import pipelines
from tf_transformer.cpu import bfloat16_units, cpu_info, onednn_isa_cap


def has_bfloat16_hardware() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AMX or AVX-512 BF16); elsewhere it is emulated."""
    return bool(bfloat16_units())


def machine() -> str:
    """The CPU as benchmarks record it: model, cores, and the matrix units that decide bfloat16 speed.

    Speeds differ several-fold between CPUs with AMX / AVX-512 and AVX2-only ones
    (bfloat16 is slower than float32 without native support), so every result names it.
    """
    model, flags = cpu_info()
    units = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
    name = " ".join(part for part in (platform.machine(), model) if part)
    cap = onednn_isa_cap()
    return (
        f"{name}, {os.cpu_count()} cores"
        + (f" ({' '.join(units)})" if units else "")
        + (f", ONEDNN_MAX_CPU_ISA={cap}" if cap else "")
    )


def matmul_peak(dtype: str, n: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of the best of ``repeats`` ``n×n`` matmuls in ``dtype``: the MFU denominator."""
    a = tf.cast(tf.random.normal((n, n), dtype=tf.float32), dtype)
    matmul = tf.function(lambda x: tf.matmul(x, x))
    matmul(a).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


class StepTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each training step of a ``fit`` call (``times``)."""

    def on_train_begin(self, logs=None):
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


def source_batches(tokenizer, lines: list[str], batch: int) -> list[np.ndarray]:
    """``lines`` in file order as ``int32[batch, len]`` ids, each ending in EOS, 0-padded."""
    batches = []
    for start in range(0, len(lines), batch):
        ids = tokenizer.tokenize(tf.constant(lines[start : start + batch]))
        ids = tf.concat([ids, tf.fill([ids.nrows(), 1], pipelines.EOS_ID)], axis=1)
        batches.append(ids.to_tensor(default_value=pipelines.PAD_ID).numpy().astype("int32"))
    return batches


def timed(run, batches) -> float:
    """Seconds ``run`` takes over all ``batches`` after one warm-up call (tracing) on the first.

    ``run`` must return only once its result is computed (e.g. call ``.numpy()``).
    """
    run(batches[0])
    start = time.perf_counter()
    for batch in batches:
        run(batch)
    return time.perf_counter() - start


def rotated(names: list, offset: int) -> list:
    """``names`` starting at ``offset`` (wrapping): the order a benchmark runs its systems in at turn ``offset``."""
    offset %= max(len(names), 1)
    return names[offset:] + names[:offset]


def median_ms(seconds: list[float]) -> float:
    """The median of ``seconds`` in milliseconds: a batch's p50 latency."""
    ordered = sorted(seconds)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return round(1000 * median, 2)


def ctranslate2_length_penalty(alpha: float, sentencepiece, references: list[str]) -> tuple[float, float]:
    """``(L, length_penalty)``: CTranslate2's penalty that grows as our GNMT one near ``L``, the references' mean
    length in pieces with EOS. It divides by ``length ** length_penalty``, we by ``((5 + length) / 6) ** α``,
    so it gets ``α · L / (L + 5)`` (docs/ctranslate2.md)."""
    mean_length = sum(len(sentencepiece.encode(line)) + 1 for line in references) / len(references)
    return mean_length, round(alpha * mean_length / (mean_length + 5), 3)


def ctranslate2_system(translator, sentencepiece, beam_size: int, max_extra_length: int, **options):
    """A CTranslate2 ``translator`` as a benchmark system: strings in (SentencePiece pieces through the python
    package), strings out. Its maximum output length is ours (source + EOS + ``max_extra_length`` for the batch's
    longest source) unless ``options`` set one; ``options`` go to ``translate_batch``."""

    def call(batch):
        pieces = sentencepiece.encode(batch, out_type=str)
        settings = dict(options)
        if "max_decoding_length" not in settings:
            # Ours: at most source + EOS + max_extra_length tokens, the last forced to EOS. CTranslate2 stops
            # after max_decoding_length tokens, EOS or not: one fewer, for the batch's longest source.
            settings["max_decoding_length"] = max(map(len, pieces)) + max_extra_length
        results = translator.translate_batch(
            pieces,
            beam_size=beam_size,
            suppress_sequences=[["<pad>"], ["<s>"]],  # the tokens our search never chooses
            **settings,
        )
        return [sentencepiece.decode(result.hypotheses[0]) for result in results]

    return call

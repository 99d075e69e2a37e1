"""Speed side by side with the toolkits users would pick instead (a benchmark, not a test).

    pip install -e '.[bench]'     # keras-hub, transformers, torch (CPU), ctranslate2, tokenizers
    python -m benchmarks.peers --size small --size base
    python -m benchmarks.peers --parts decode --workers 2 --systems ours,ct2

Same machine, same run, same threads (``--threads``), same model dimensions; the
systems (ours, keras-hub, Hugging Face ``MarianMTModel``, CTranslate2) and what each
runs are described in their modules of :mod:`benchmarks.peers`.

Training: target tokens/s of optimizer steps on one identical batch
(``--train_batch`` sentences × ``--src_len`` / ``--tgt_len`` tokens), float32 and
each system's best CPU precision (Hugging Face's bfloat16 training only on CPUs
with bfloat16 hardware unless ``--hf_bfloat16_train=always``). Decoding: beam 4,
batch 32, the first 512 sentences of newstest2013 tokenized by a SentencePiece
model trained on them (the same ids for all), every output forced to
``--output_tokens`` tokens so every system does the same work; target tokens/s.
Weights are random: this measures speed only. Ratios are ours ÷ peer, each at its
best precision unless the key names one: ``vs_ct2_fp32`` / ``vs_ct2_int8`` put our
fastest export against that CTranslate2 compute type, and ``decode_ratio_float32_vs_ct2_fp32``
and the ``_float32`` keys are float32 on both sides (where bfloat16 runs in hardware our
fastest is the bfloat16 export). The last line is one JSON object.

Systems are interleaved, because a shared machine's speed drifts over minutes: every
system is built and warmed up first, then training runs in ``--rounds`` rounds of a
few steps of each system in turn, and decoding goes batch by batch, each batch through
every system in turn (the order rotating). Measured one after another, a ratio would
depend on when each system ran.

Two threads can serve a stream of batches in three ways, and each system is measured in
those it offers: both threads on one batch at a time (every system); each batch split
into ``--batch_parts`` equal parts decoded side by side (ours: an export with that many loops;
CTranslate2: ``inter_threads`` workers on the parts); and ``--workers`` whole batches
at once, one per worker (ours: concurrent calls of a one-loop export's signature, as
TF Serving runs concurrent requests; CTranslate2: ``inter_threads`` workers, each
batch submitted asynchronously). A ``--workers N`` run also measures our N-stream
export on each batch's parts and CTranslate2 in all three ways; ratios take each
system's fastest way in the run.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf
from absl import app, flags, logging

from benchmarks.common import has_bfloat16_hardware, machine, matmul_peak, rotated
from benchmarks.peers import SYSTEMS, DecodingWorkload, system, workload
from benchmarks.peers.workload import FLAGS, decoding_workload, set_threads

flags.adopt_module_key_flags(workload)  # --help lists the workload's flags, defined there


def _median_tokens_per_second(times: list[float]) -> float:
    return FLAGS.train_batch * FLAGS.tgt_len / statistics.median(times)


def _ratio(ours: float | None, peer: float | None) -> float | None:
    return round(ours / peer, 3) if ours and peer else None


def _set_mfu(result: dict, ours: dict, peaks: dict) -> None:
    """``result["train_mfu"]`` from ``ours`` (our training figures) and the best peaks of the run."""
    best_key = max(ours, key=lambda k: ours[k]["tokens_per_second"])
    for figures in ours.values():
        figures["mfu"] = round(figures["achieved_flops"] / peaks[figures["peak_key"]], 4)
    result["train_mfu"] = ours[best_key]["mfu"]
    result["train_mfu_precision"] = best_key.removeprefix("ours_")


def interleaved_training(runners: dict, log) -> dict:
    """Target tokens/s of each ``run(steps)`` in ``runners``: ``--rounds`` interleaved rounds, median step.

    Every round times ``--steps / --rounds`` steps of each system in turn (the
    order rotating), so a slow phase of a shared machine hits all systems alike
    instead of whichever ran then.
    """
    per_round = FLAGS.steps // FLAGS.rounds
    times = {name: [] for name in runners}
    for round_ in range(FLAGS.rounds):
        for name in rotated(list(runners), round_):
            times[name] += runners[name](per_round)
    speeds = {name: _median_tokens_per_second(t) for name, t in times.items()}
    for name, speed in speeds.items():
        log(f"train {name}", round(speed))
    return speeds


def interleaved_decoding(runners: dict, batches: list[np.ndarray], log) -> dict:
    """Target tokens/s of each ``run(group)`` in ``runners`` over all ``batches``, interleaved group by group.

    A group is ``--workers`` consecutive batches (one batch without ``--workers``).
    Each system first decodes the first group once untimed (tracing, warm-up);
    then every group is decoded by every system in turn (the order rotating), so
    drift of a shared machine's speed during the run falls on all systems alike.
    """
    groups = [list(range(i, min(i + FLAGS.workers, len(batches)))) for i in range(0, len(batches), FLAGS.workers)]
    for run in runners.values():
        run(groups[0])
    seconds = dict.fromkeys(runners, 0.0)
    for g, group in enumerate(groups):
        for name in rotated(list(runners), g):
            start = time.perf_counter()
            runners[name](group)
            seconds[name] += time.perf_counter() - start
    tokens = sum(len(b) for b in batches) * FLAGS.output_tokens
    speeds = {name: round(tokens / spent, 1) for name, spent in seconds.items()}
    for name, speed in speeds.items():
        log(f"decode {name}", speed)
    return speeds


def measure_size(size: str, decoding: DecodingWorkload, peaks: dict) -> dict:
    """Every system's training and decoding speed at ``size`` dimensions, systems interleaved."""
    systems = [name for name in SYSTEMS if name in FLAGS.systems]  # built and interleaved in SYSTEMS' order
    log = lambda what, value: print(f"[{size}] {what}: {value}", flush=True)  # noqa: E731
    train = measure_training(size, systems, peaks, log) if "train" in FLAGS.parts else {}
    decode = measure_decoding(size, systems, decoding, log) if "decode" in FLAGS.parts else {}

    def best(table, prefix, key=None):
        values = [(v[key] if key else v) for k, v in table.items() if k.startswith(prefix)]
        return max(values) if values else None

    ours_train_best = best(train, "ours", "tokens_per_second")
    ours_decode_best = best(decode, "ours")
    return {
        "ours_train": {k: v for k, v in train.items() if k.startswith("ours")},
        "train_tokens_per_second": {k: v["tokens_per_second"] for k, v in train.items()},
        "decode_tokens_per_second": decode,
        "params": {k: v["params"] for k, v in train.items()},
        "train_ratio_vs_keras_hub": _ratio(ours_train_best, best(train, "keras_hub", "tokens_per_second")),
        "train_ratio_vs_hf": _ratio(ours_train_best, best(train, "hf", "tokens_per_second")),
        "train_ratio_vs_hf_float32": _ratio(
            train.get("ours_float32", {}).get("tokens_per_second"), train.get("hf_float32", {}).get("tokens_per_second")
        ),
        "decode_ratio_vs_hf": _ratio(ours_decode_best, best(decode, "hf")),
        "decode_ratio_vs_hf_float32": _ratio(decode.get("ours_float32"), decode.get("hf_float32")),
        # Against CTranslate2's faster way of using the threads when it was measured both ways.
        "decode_ratio_vs_ct2_fp32": _ratio(ours_decode_best, best(decode, "ct2_float32")),
        "decode_ratio_vs_ct2_int8": _ratio(ours_decode_best, best(decode, "ct2_int8")),
        # Float32 against float32, each in its fastest way: where bfloat16 runs in hardware our best is
        # the bfloat16 export, whose results differ a little from float32's.
        "decode_ratio_float32_vs_ct2_fp32": _ratio(best(decode, "ours_float32"), best(decode, "ct2_float32")),
    }


def measure_training(size: str, systems: list[str], peaks: dict, log) -> dict:
    """Every system's training figures at ``size`` dimensions, interleaved (see :func:`interleaved_training`)."""
    trainings = {}
    for name in systems:
        trainings.update(system(name).train_runners(size))
    speeds = interleaved_training({name: training.run for name, training in trainings.items()}, log)
    train = {name: {**trainings[name].figures, "tokens_per_second": round(speed)} for name, speed in speeds.items()}
    for name, entry in train.items():
        if "flops_per_step" in entry:  # ours: its MFU
            entry["achieved_flops"] = round(
                entry.pop("flops_per_step") * speeds[name] / (FLAGS.train_batch * FLAGS.tgt_len)
            )
            # The peak is re-measured after each size's training and the MFU divides by the best
            # peak of the whole run (see main): on a shared machine one measurement can come out
            # low (a single start-up measurement once gave an MFU above 1).
            peaks[entry["peak_key"]] = max(peaks[entry["peak_key"]], matmul_peak(entry["peak_key"]))
    del trainings  # free the training models before decoding (they hold reference cycles)
    gc.collect()
    return train


def measure_decoding(size: str, systems: list[str], decoding: DecodingWorkload, log) -> dict:
    """Every system's decoding speed at ``size`` dimensions, interleaved (see :func:`interleaved_decoding`)."""
    decoders = {}
    for name in systems:
        decoders.update(system(name).decode_runners(size, decoding))
    return interleaved_decoding(decoders, decoding.batches, log)


def main(argv):
    del argv
    if not os.path.exists(FLAGS.data):
        raise app.UsageError(f"--data {FLAGS.data}: not found (real corpora live in ../shared/data)")
    unknown = set(FLAGS.systems) - set(SYSTEMS)
    if unknown:
        raise app.UsageError(f"--systems: {', '.join(sorted(unknown))} unknown (known: {', '.join(SYSTEMS)})")
    if FLAGS.rounds < 1 or FLAGS.steps % FLAGS.rounds:
        raise app.UsageError(f"--steps {FLAGS.steps} must be a positive multiple of --rounds {FLAGS.rounds}")
    if not set(FLAGS.parts) <= {"train", "decode"} or not FLAGS.parts:
        raise app.UsageError(f"--parts {','.join(FLAGS.parts)}: give train, decode or both")
    if FLAGS.batch_parts > 1 and "train" in FLAGS.parts:
        raise app.UsageError("--batch_parts needs --parts decode: training would run with fewer intra-op threads")
    if FLAGS.threads % FLAGS.batch_parts:
        raise app.UsageError(f"--threads {FLAGS.threads} must be a multiple of --batch_parts {FLAGS.batch_parts}")
    if FLAGS.workers > 1 and "train" in FLAGS.parts:
        raise app.UsageError("--workers needs --parts decode: training would run with fewer intra-op threads")
    if FLAGS.workers > 1 and FLAGS.batch_parts > 1:
        raise app.UsageError("--workers and --batch_parts are two ways to use the threads: give one")
    if FLAGS.threads % FLAGS.workers:
        raise app.UsageError(f"--threads {FLAGS.threads} must be a multiple of --workers {FLAGS.workers}")
    batches = -(-FLAGS.sentences // FLAGS.batch)
    if batches % FLAGS.workers:
        raise app.UsageError(
            f"--sentences {FLAGS.sentences} make {batches} batches of {FLAGS.batch}, not a multiple of "
            f"--workers {FLAGS.workers}: the last group would leave workers idle"
        )
    logging.set_verbosity(logging.WARNING)
    set_threads()
    peaks = {"float32": matmul_peak("float32"), "bfloat16": matmul_peak("bfloat16")}
    results = {}
    with tempfile.TemporaryDirectory() as work:
        decoding = decoding_workload(work)
        for size in FLAGS.size:
            results[size] = measure_size(size, decoding, peaks)
            print(json.dumps({size: results[size]}), flush=True)
    for result in results.values():  # every MFU against the best peaks of the whole run
        if result["ours_train"]:
            _set_mfu(result, result["ours_train"], peaks)
    headline = results.get("base") or results[FLAGS.size[-1]]
    keys = [
        "train_ratio_vs_keras_hub",
        "train_ratio_vs_hf",
        "decode_ratio_vs_hf",
        "decode_ratio_vs_ct2_fp32",
        "decode_ratio_float32_vs_ct2_fp32",
        "decode_ratio_vs_ct2_int8",
        "train_mfu",
    ]
    print(
        json.dumps(
            {
                "benchmark": "peers",
                **{key: headline.get(key) for key in keys},
                "headline_size": "base" if "base" in results else FLAGS.size[-1],
                "results": results,
                "peak_matmul_flops": {k: round(v) for k, v in peaks.items()},
                "decode": {"beam": FLAGS.beam, "batch": FLAGS.batch, "sentences": FLAGS.sentences},
                "output_tokens": FLAGS.output_tokens,
                "train_batch": [FLAGS.train_batch, FLAGS.src_len, FLAGS.tgt_len],
                "threads": FLAGS.threads,
                "parts": FLAGS.parts,
                "batch_parts": FLAGS.batch_parts,
                "workers": FLAGS.workers,
                "hf_bfloat16_train": FLAGS.hf_bfloat16_train,
                "bfloat16_hardware": has_bfloat16_hardware(),
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

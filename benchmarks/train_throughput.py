"""Training throughput benchmark (not a test): tokens/s, step time, FLOPs and MFU.

    python -m benchmarks.train_throughput --config small
    python -m benchmarks.train_throughput --config tiny --config small --config base
    python -m benchmarks.train_throughput --config small --config small:d_model=128,d_ff=256,num_layers=4

For each config, precision (float32, mixed_bfloat16) and XLA (off, on) it times
optimizer steps of our compiled model (the paper's loss and optimizer) on
identical fixed-shape batches, and measures the machine's matmul peak in the
same run (a large float32 and bfloat16 matmul). The last line is one JSON object.
"""

from __future__ import annotations

import json
import statistics

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

from benchmarks.common import StepTimer, machine, matmul_peak
from configs import get_config, parse_overrides
from tf_transformer import build_transformer
from tf_transformer.flops import training_flops
from tf_transformer.training.trainer import compile_model

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "config", ["small"], "Preset(s) to measure, each optionally with overrides: small:d_ff=512,num_layers=4."
)
flags.DEFINE_multi_string("precision", ["float32", "mixed_bfloat16"], "Precision(s).")
flags.DEFINE_multi_string("xla", ["off", "on"], "XLA settings: off, on.")
flags.DEFINE_integer("batch", 64, "Sentences per batch.")
flags.DEFINE_integer("src_len", 32, "Source tokens per sentence (incl. EOS).")
flags.DEFINE_integer("tgt_len", 32, "Target tokens per sentence (incl. EOS).")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size (shared).")
flags.DEFINE_integer("steps", 8, "Timed steps (after 2 warm-up steps).")


def candidate(spec: str):
    """The config ``preset[:field=value,…]`` names (``--config``); ``--vocab_size`` unless it sets one."""
    name, _, overrides = spec.partition(":")
    settings = parse_overrides(overrides.split(",") if overrides else [])
    return get_config(name, **{"vocab_size": FLAGS.vocab_size, **settings})


def measure(name: str, precision: str, xla: bool, peaks: dict) -> dict:
    keras.config.set_dtype_policy(precision)
    config = candidate(name)
    model = compile_model(build_transformer(config), config, jit_compile=xla)
    rng = np.random.default_rng(0)
    src = rng.integers(4, config.vocab_size, (FLAGS.batch, FLAGS.src_len)).astype("int32")
    tgt = rng.integers(4, config.vocab_size, (FLAGS.batch, FLAGS.tgt_len)).astype("int32")
    data = tf.data.Dataset.from_tensors(({"inputs": src, "targets": tgt}, tgt)).repeat()
    timer = StepTimer()
    model.fit(data, steps_per_epoch=FLAGS.steps + 2, epochs=1, verbose=0, callbacks=[timer])
    step = statistics.median(timer.times[2:])
    flops = training_flops(config, FLAGS.batch, FLAGS.src_len, FLAGS.tgt_len)
    key = "bfloat16" if "bfloat16" in precision else "float32"
    peaks[key] = max(peaks[key], matmul_peak(key))  # re-measured beside each run; the best is kept
    keras.config.set_dtype_policy("float32")
    return {
        "config": name,
        "precision": precision,
        "xla": xla,
        "params": int(model.count_params()),
        "vocab_size": config.vocab_size,
        "step_seconds": round(step, 4),
        "target_tokens_per_second": round(FLAGS.batch * FLAGS.tgt_len / step),
        "model_flops_per_step": flops,
        "achieved_flops": round(flops / step),
        "peak_key": key,
    }


def main(argv):
    del argv
    peaks = {"float32": matmul_peak("float32"), "bfloat16": matmul_peak("bfloat16")}
    results = []
    for name in FLAGS.config:
        for precision in FLAGS.precision:
            for xla in FLAGS.xla:
                result = measure(name, precision, xla == "on", peaks)
                print(json.dumps(result), flush=True)
                results.append(result)
    for result in results:  # every MFU against the best peak of the whole run
        result["peak_matmul_flops"] = round(peaks[result["peak_key"]])
        result["mfu"] = round(result["achieved_flops"] / peaks[result.pop("peak_key")], 4)
    print(
        json.dumps(
            {
                "benchmark": "train_throughput",
                "batch": [FLAGS.batch, FLAGS.src_len, FLAGS.tgt_len],
                "peak_matmul_flops": {k: round(v) for k, v in peaks.items()},
                "results": results,
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

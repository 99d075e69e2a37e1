"""Benchmarks of tf_transformer: speed and quality measurements, not tests.

Run each from the repository root as a module, e.g. ``python -m benchmarks.decode``;
the last line it prints is one JSON object naming the machine. What each one measures,
how to reproduce it and how long it takes: ``benchmarks/README.md``; today's figures:
``docs/benchmarks.md``.

- ``pipeline``, ``train_throughput``, ``decode``, ``quality`` (and ``multi30k.sh``):
  our own input pipeline, training, decoding and translation quality.
- ``peers``: speed side by side with keras-hub, Hugging Face transformers and CTranslate2.
- ``profiling``: tools that explain a number rather than produce one.
"""

import json
import os

# As tf_transformer does, and before any benchmark loads TensorFlow: TensorFlow's oneDNN
# kernels also on CPUs where it would fall back to Eigen (AVX2-only). Every benchmark
# runs as ``python -m benchmarks.X``, so this package is imported before the script.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def skipped_without(benchmark: str, paths) -> bool:
    """Whether a corpus of ``paths`` is missing; if so prints why and the JSON line of a skipped ``benchmark``."""
    missing = [path for path in paths if not os.path.exists(path)]
    if missing:
        print(f"benchmarks.{benchmark}: {', '.join(missing)} not found (the corpora live in ../shared/data): skipped")
        print(json.dumps({"benchmark": benchmark, "skipped": f"{', '.join(missing)} not found"}))
    return bool(missing)


def start_tensorflow(threads: int):
    """TensorFlow on ``threads`` intra- and inter-op threads, with tensorflow-text's ops registered (exports need
    them); returns the ``tensorflow`` module."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import tensorflow_text  # noqa: F401  registers the SentencePiece ops of a SavedModel

    return tf

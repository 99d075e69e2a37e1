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

import os

# As tf_transformer does, and before any benchmark loads TensorFlow: TensorFlow's oneDNN
# kernels also on CPUs where it would fall back to Eigen (AVX2-only). Every benchmark
# runs as ``python -m benchmarks.X``, so this package is imported before the script.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

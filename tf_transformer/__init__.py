"""tf_transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras 3."""

import os

# TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX-512/AMX
# features; elsewhere (AVX2-only CPUs) it falls back to Eigen, whose matmuls with a
# transposed operand (attention scores, the tied output projection) run at a third
# of the speed. Measured on a 2-core AVX2 CPU (docs/benchmarks.md): training +29 %,
# beam search +22-43 %. Only takes effect when this package is imported before
# TensorFlow; set TF_ENABLE_ONEDNN_OPTS=0 to keep Eigen.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

__version__ = "0.1.0"

from tf_transformer.model import Transformer, build_transformer  # noqa: E402

__all__ = ["Transformer", "build_transformer", "__version__"]

"""tf_transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras 3.

``Transformer`` and ``build_transformer`` are imported on first use, so that
light modules (``tf_transformer.constants``, ``tf_transformer.cpu``) load
without Keras.
"""

import os

# TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX-512/AMX
# features; elsewhere (AVX2-only CPUs) it falls back to Eigen, which runs the
# transposed products of attention and the tied output projection much slower
# (docs/design/decoding.md). Takes effect only when this package is imported before
# TensorFlow; set TF_ENABLE_ONEDNN_OPTS=0 to keep Eigen.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

__version__ = "0.1.0"

__all__ = ["Transformer", "build_transformer", "__version__"]


def __getattr__(name):
    if name in ("Transformer", "build_transformer"):
        from tf_transformer import model

        return getattr(model, name)
    raise AttributeError(f"module 'tf_transformer' has no attribute {name!r}")

"""tf_transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras 3.

``Transformer`` and ``build_transformer`` are imported on first use, so that
light modules (``tf_transformer.constants``, ``tf_transformer.cpu``) load
without Keras.
"""

import importlib
import os

# TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX-512/AMX
# features; elsewhere (AVX2-only CPUs) it falls back to Eigen, which runs the
# transposed products of attention and the tied output projection much slower
# (docs/design/decoding.md). Takes effect only when this package is imported before
# TensorFlow; set TF_ENABLE_ONEDNN_OPTS=0 to keep Eigen.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

__version__ = "0.1.0"


def lazy_attributes(package: str, exports: dict[str, str]):
    """A package's module ``__getattr__`` (PEP 562): each name of ``exports`` (name → submodule) is taken
    from its submodule on first use, so that importing the package loads neither Keras nor TensorFlow."""

    def __getattr__(name):
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


_EXPORTS = {"Transformer": "model", "build_transformer": "model"}
__all__ = [*_EXPORTS, "__version__"]
__getattr__ = lazy_attributes(__name__, _EXPORTS)

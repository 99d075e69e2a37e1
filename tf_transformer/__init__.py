"""tf_transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras 3."""

__version__ = "0.1.0"

from tf_transformer.model import Transformer, build_transformer  # noqa: E402

__all__ = ["Transformer", "build_transformer", "__version__"]

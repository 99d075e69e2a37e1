"""Weights stored in a 16-bit dtype for inference (exports with ``--precision bfloat16``)."""

from __future__ import annotations

from keras import ops

from tf_transformer.model import Transformer


def inference_copy(model: Transformer, dtype: str) -> Transformer:
    """``model`` with its weights stored, and computed, in ``dtype`` (``"bfloat16"``, ``"float16"``…).

    Under a mixed policy every layer casts its float32 variables to the compute
    dtype on every call, in a decoding loop at every step (the decoder's kernels
    are cast once per search, but the shared embedding would be cast every step).
    Inference needs no float32 master weights: this copy holds them in ``dtype``
    once, so the matmuls see the same inputs as under ``mixed_<dtype>`` without
    the casts. Layer norms still compute in float32, from float32 γ and β
    (:class:`~tf_transformer.layers.normalization.LayerNormalization`); attention's
    softmax, the memory's keys and values and the logits stay float32.
    """
    config = model.get_config()
    config["dtype"] = dtype
    config["name"] = f"{model.name}_{dtype}"
    copy = Transformer.from_config(config).build_for_shapes()
    for target, source in zip(copy.weights, model.weights, strict=True):
        target.assign(ops.cast(source, target.dtype))
    return copy

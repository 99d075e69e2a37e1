"""Dense kernels laid out for incremental decoding: cast, fused and laid out once per search.

Each decoder step multiplies one row per hypothesis (batch × beam rows) by
every kernel of the decoder. Which layout of a kernel multiplies fastest
depends on the product and the CPU, so each layer picks its own: the attention
projections stay in Keras's ``[in, units]`` layout; the position-wise
feed-forward kernels are stored transposed (``[units, in]``, multiplied with
``transpose_b``) except in float32 on CPUs with AVX-512
(:func:`feed_forward_transposed`). The self-attention's query, key and value
projections run as one product of triple width, and the query's columns carry
eq. 1's 1/√d_k where that is exact
(:func:`~tf_transformer.layers.attention.folded_query_scale`). docs/design/decoding.md gives
the measurements behind each choice. These are copies for inference, never
trained.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from tf_transformer.cpu import usable_flags
from tf_transformer.layers.attention import folded_query_scale


def feed_forward_transposed(dtype="float32") -> bool:
    """Whether decoding stores the ``dtype`` feed-forward kernels transposed (see the module docstring).

    ``[in, units]`` only for float32 on CPUs with AVX-512 (within oneDNN's ISA
    cap, :func:`~tf_transformer.cpu.usable_flags`); elsewhere, and where the
    CPU's flags cannot be read, transposed. An export keeps the layout of
    the machine that traced it, so export on the kind of CPU that will serve
    it. Either layout gives the same products up to float rounding (oneDNN
    sums in another order).
    """
    return keras.backend.standardize_dtype(dtype) != "float32" or "avx512f" not in usable_flags()


def decoding_kernel(denses: list[keras.layers.Dense], dtype, transpose: bool, scales=None) -> dict:
    """The kernels of ``denses`` side by side in ``dtype``, with their biases, for :func:`project`.

    ``{"kernel": [in, Σ units]}``, or with ``transpose`` ``{"kernel_t": [Σ
    units, in]}``, plus ``"bias"`` ``[Σ units]`` when the layers have biases.
    ``denses`` share their input and all have biases or none; activations
    are applied by the caller. ``scales``: a factor per dense (``None``: 1),
    applied to its kernel and bias, so to its outputs.
    """
    scales = scales or [None] * len(denses)

    def scaled(weight, scale):
        weight = ops.cast(weight, dtype)
        return weight if scale is None else weight * ops.cast(scale, dtype)

    kernel = ops.concatenate(
        [scaled(d.kernel, s) for d, s in zip(denses, scales, strict=True)], axis=-1
    )  # [in, Σ units]
    weights = {"kernel_t": ops.transpose(kernel)} if transpose else {"kernel": kernel}
    if denses[0].use_bias:
        weights["bias"] = ops.concatenate(
            [scaled(d.bias, s) for d, s in zip(denses, scales, strict=True)], axis=-1
        )  # [Σ units]
    return weights


def project(rows, weights: dict):
    """``rows`` ``[n, in]`` times the kernel of :func:`decoding_kernel`, plus its bias: ``[n, Σ units]``."""
    if "kernel_t" in weights:
        output = tf.linalg.matmul(rows, weights["kernel_t"], transpose_b=True)  # [n, Σ units]
    else:
        output = tf.linalg.matmul(rows, weights["kernel"])  # [n, Σ units]
    if "bias" in weights:
        output = output + weights["bias"]  # [n, Σ units]
    return output


def attention_kernels(attention, self_attention: bool) -> dict:
    """A :class:`~tf_transformer.layers.attention.MultiHeadAttention`'s kernels laid out for decoding.

    ``input`` projects a hypothesis's row to its query, and for self-attention
    to its query, key and value in one product (``[h·d_k | h·d_k | h·d_v]``
    wide), the query already times 1/√d_k where that is exact
    (:func:`~tf_transformer.layers.attention.folded_query_scale`: the same bits
    as scaling after the product); ``output`` is W^O. Both in Keras's ``[in,
    units]`` layout.
    """
    inputs = (
        [attention.query_dense, attention.key_dense, attention.value_dense]
        if self_attention
        else [attention.query_dense]
    )
    scales = [folded_query_scale(attention.key_dim)] + [None] * (len(inputs) - 1)
    return {
        "input": decoding_kernel(inputs, attention.compute_dtype, transpose=False, scales=scales),
        "output": decoding_kernel([attention.output_dense], attention.compute_dtype, transpose=False),
    }


def feed_forward_kernels(feed_forward) -> dict:
    """W1, b1, W2, b2 of a :class:`~tf_transformer.layers.feed_forward.PositionwiseFeedForward` for
    :func:`feed_forward_rows`, transposed or not as :func:`feed_forward_transposed` says."""
    transpose = feed_forward_transposed(feed_forward.compute_dtype)
    return {
        "inner": decoding_kernel([feed_forward.inner], feed_forward.compute_dtype, transpose=transpose),
        "outer": decoding_kernel([feed_forward.outer], feed_forward.compute_dtype, transpose=transpose),
    }


def feed_forward_rows(feed_forward, rows, weights: dict):
    """Eq. 2 on ``rows`` ``[n, d_model]`` with :func:`feed_forward_kernels` (inference: no dropout)."""
    hidden = feed_forward.inner.activation(project(rows, weights["inner"]))  # [n, d_ff]
    return project(hidden, weights["outer"])  # [n, output_dim]

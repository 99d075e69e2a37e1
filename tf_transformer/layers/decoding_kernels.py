"""Dense kernels laid out for incremental decoding: cast, fused and laid out once per search.

Each decoder step multiplies one row per hypothesis (batch × beam rows, e.g. 64
or 128) by every kernel of the decoder. Which layout of a kernel multiplies
fastest depends on the product, so each layer picks its own (measured end to
end, exports of the same weights decoding newstest2013 interleaved, ids
identical but for one near-tie in 512 sentences, on 2-core CPUs with
TensorFlow's oneDNN kernels): the attention projections run faster in Keras's ``[in, units]`` layout (AVX2: +2.2 % at
``small`` and +1.8 % at ``base`` against ``[units, in]``; AVX-512: +2.5 % at
``small``). For the position-wise feed-forward kernels the CPU decides
(:func:`feed_forward_transposed`): on AVX2 they run faster stored transposed
(``[units, in]``, ``transpose_b``; ``[in, units]`` was −1 % at ``small``, −2 %
at ``base``), on AVX-512 in ``[in, units]`` (+4.1 % at ``small``, +4.8 % at
``base``; measured on an AMD Zen 4 only, not on Intel AVX-512 or AMX CPUs), but
only in float32: bfloat16 kernels stay transposed (``[in, units]`` −1.2 % / −2 %). The
self-attention's query, key and value projections run as one product of triple
width. Translation prepares these once per batch, outside the decoding loop;
they are copies for inference, never trained.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops
from tensorflow.python.ops import control_flow_util

from tf_transformer.cpu import cpu_info


def in_xla() -> bool:
    """Whether the graph being built is compiled by XLA, which has no ``InplaceUpdate`` kernel."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def feed_forward_transposed(dtype="float32") -> bool:
    """Whether decoding stores the ``dtype`` feed-forward kernels transposed (module docstring).

    ``[in, units]`` only for float32 on CPUs with AVX-512: bfloat16 kernels
    ran 1–2 % slower so there (Zen 4, ``small`` / ``base``). Elsewhere, and
    where the CPU's flags cannot be read, transposed. An export keeps the
    layout of the machine that traced it, so export on the kind of CPU that
    will serve it. Either layout gives the same products up to float rounding
    (oneDNN sums in another order).
    """
    return keras.backend.standardize_dtype(dtype) != "float32" or "avx512f" not in cpu_info()[1]


def decoding_kernel(denses: list[keras.layers.Dense], dtype, transpose: bool) -> dict:
    """The kernels of ``denses`` side by side in ``dtype``, with their biases, for :func:`project`.

    ``{"kernel": [in, Σ units]}``, or with ``transpose`` ``{"kernel_t": [Σ
    units, in]}``, plus ``"bias"`` ``[Σ units]`` when the layers have biases.
    ``denses`` share their input and all have biases or none; activations
    are applied by the caller.
    """
    kernel = ops.concatenate([ops.cast(dense.kernel, dtype) for dense in denses], axis=-1)  # [in, Σ units]
    weights = {"kernel_t": ops.transpose(kernel)} if transpose else {"kernel": kernel}
    if denses[0].use_bias:
        weights["bias"] = ops.concatenate([ops.cast(dense.bias, dtype) for dense in denses], axis=-1)  # [Σ units]
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

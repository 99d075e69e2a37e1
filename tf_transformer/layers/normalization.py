"""Layer normalization with fewer element-wise passes (the LayerNorm of section 3.1)."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tf_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """``keras.layers.LayerNormalization`` over the last axis, computed in fewer ops.

    Section 3.1: "the output of each sub-layer is LayerNorm(x + Sublayer(x))" (Ba et
    al., 2016): ``(x − mean) / √(var + ε) · γ + β`` over the features of each position.
    Keras 3 takes the variance from ``tf.nn.moments`` (a squared difference from the
    mean) and then applies the norm as a second affine pass that folds the mean in;
    here ``x − mean`` is formed once and reused for both. Same arguments, weights and
    config as Keras's layer, float32 statistics for 16-bit inputs, fewer passes over the
    activations in training and decoding (docs/design/training.md). Other axes, ``rms_scaling``,
    ``center=False`` or ``scale=False`` and float64 inputs take Keras's computation.

    γ and β are never 16-bit: a pure 16-bit policy (an inference copy,
    :func:`~tf_transformer.decoding.precision.inference_copy`) stores them as its
    mixed counterpart does, since the norm computes in float32 and would otherwise
    cast both at every call, twice per sub-layer and decoding step.
    """

    def __init__(self, *args, dtype=None, **kwargs):
        super().__init__(*args, dtype=_float32_variables(dtype), **kwargs)

    def call(self, inputs):
        last_axis = self.axis in ([-1], [len(inputs.shape) - 1])
        if not last_axis or self.rms_scaling or not (self.center and self.scale) or inputs.dtype == tf.float64:
            return super().call(inputs)
        x = tf.cast(inputs, "float32")  # [..., d]
        centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)  # [..., d]
        variance = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)  # [..., 1]
        scale = tf.math.rsqrt(variance + self.epsilon) * tf.cast(self.gamma, "float32")  # [..., d]
        return tf.cast(centred * scale + tf.cast(self.beta, "float32"), self.compute_dtype)


def _float32_variables(dtype):
    """``dtype`` (a Keras dtype policy, its name, or ``None``: the global one), with float32 variables where it
    stores 16-bit ones."""
    policy = keras.config.dtype_policy() if dtype is None else keras.dtype_policies.get(dtype)
    if policy.variable_dtype in ("bfloat16", "float16") and policy.compute_dtype == policy.variable_dtype:
        return keras.dtype_policies.get(f"mixed_{policy.compute_dtype}")
    return dtype

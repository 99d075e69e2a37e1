"""Positional information: sinusoids (section 3.5) or learned embeddings (Table 3 row E)."""

from __future__ import annotations

import math

import keras
from keras import ops

LAYOUTS = ("interleaved", "halves")
TIMESCALES = ("paper", "tensor2tensor")


@keras.saving.register_keras_serializable(package="tf_transformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(…), section 3.5.

    Has no weights; any length works (the paper's reason for choosing sinusoids).
    Two choices other implementations made differently, kept so their checkpoints
    run as they were trained (docs/importing.md):

    - ``layout``: ``"interleaved"`` (the paper's formula: sines at even channels,
      cosines at odd ones) or ``"halves"`` (``[sin | cos]``: all sines, then all
      cosines, as tensor2tensor and Marian lay them out);
    - ``timescales``: ``"paper"`` (channel pair i turns at 1 / 10000^(2i/d_model))
      or ``"tensor2tensor"`` (at exp(−i · ln 10000 / (d_model/2 − 1)), so the last
      pair's wavelength is exactly 10000·2π; Marian's C++ computes this one).

    Args:
      max_wavelength: the 10000 of the formula.
      layout, timescales: see above.

    Call args:
      x: ``[batch, len, d_model]``; only its length and width are used.
      start_index: position of ``x[:, 0]`` (non-zero during incremental decoding).

    Returns:
      ``[len, d_model]`` encodings in the compute dtype, to be added to ``x``.
    """

    def __init__(
        self, max_wavelength: float = 10000.0, layout: str = "interleaved", timescales: str = "paper", **kwargs
    ):
        super().__init__(**kwargs)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if timescales not in TIMESCALES:
            raise ValueError(f"timescales must be one of {TIMESCALES}, got {timescales!r}")
        self.max_wavelength = max_wavelength
        self.layout = layout
        self.timescales = timescales

    def call(self, x, start_index=0):
        length, d_model = ops.shape(x)[1], ops.shape(x)[2]
        positions = ops.cast(ops.arange(length) + start_index, "float32")  # [len]
        half = d_model // 2
        if self.layout == "interleaved":
            pair = ops.arange(d_model) // 2  # [d_model]: i for channels 2i and 2i+1
            is_sine = ops.arange(d_model) % 2 == 0  # [d_model]
        else:
            pair = ops.arange(d_model) % half  # [d_model]: i for channels i and half + i
            is_sine = ops.arange(d_model) < half  # [d_model]
        if self.timescales == "paper":
            channel = ops.cast(pair * 2, "float32")  # [d_model]: 2i
            inv_freq = ops.exp(-math.log(self.max_wavelength) * channel / ops.cast(d_model, "float32"))  # [d_model]
        else:
            step = math.log(self.max_wavelength) / ops.cast(ops.maximum(half - 1, 1), "float32")
            inv_freq = ops.exp(-step * ops.cast(pair, "float32"))  # [d_model]
        angles = positions[:, None] * inv_freq[None, :]  # [len, d_model]
        encoding = ops.where(is_sine[None, :], ops.sin(angles), ops.cos(angles))  # [len, d_model]
        return ops.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, x_shape):
        return (x_shape[1], x_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength, layout=self.layout, timescales=self.timescales)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class LearnedPositionEmbedding(keras.layers.Layer):
    """One trained vector per position, Table 3 row (E) (after Gehring et al., 2017).

    Args:
      max_positions: number of positions; longer inputs are an error.
      initializer: initializer of the ``[max_positions, d_model]`` table.

    Call args:
      x: ``[batch, len, d_model]``; only its length is used.
      start_index: position of ``x[:, 0]``.

    Returns:
      ``[len, d_model]`` embeddings to be added to ``x``.
    """

    def __init__(self, max_positions: int, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_positions = max_positions
        self.initializer = keras.initializers.get(initializer)

    def build(self, x_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings", shape=(self.max_positions, x_shape[-1]), initializer=self.initializer
        )

    def call(self, x, start_index=0):
        length = ops.shape(x)[1]
        return ops.slice(self.position_embeddings, (start_index, 0), (length, ops.shape(x)[2]))  # [len, d_model]

    def compute_output_shape(self, x_shape):
        return (x_shape[1], x_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(max_positions=self.max_positions, initializer=keras.initializers.serialize(self.initializer))
        return config

"""The residual connection, dropout and LayerNorm around every sub-layer (sections 3.1 and 5.4)."""

from __future__ import annotations

import keras

from tf_transformer.layers.normalization import LayerNormalization


@keras.saving.register_keras_serializable(package="tf_transformer")
class ResidualSublayer(keras.layers.Layer):
    """Dropout, residual and LayerNorm around one sub-layer (sections 3.1 and 5.4).

    Post-LN (the paper): ``LayerNorm(x + Dropout(Sublayer(x)))``.
    Pre-LN (``pre_norm=True``): ``x + Dropout(Sublayer(LayerNorm(x)))``.
    The sub-layer itself is passed to ``call`` as a function of the
    normalized-or-not input, so this layer owns only the norm and dropout.
    A sub-layer may return ``(output, extra)`` (an attention and its weights):
    the residual then returns ``(LayerNorm(...), extra)``, so that callers can
    read what the sub-layer computed on the way (``return_attention_scores``).
    """

    def __init__(self, dropout: float = 0.1, pre_norm: bool = False, layer_norm_epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.pre_norm = pre_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="norm")
        self.residual_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, x_shape):
        self.norm.build(x_shape)

    def call(self, x, sublayer, training=None):
        output = sublayer(self.norm(x) if self.pre_norm else x)
        extra = None
        if isinstance(output, tuple):
            output, extra = output
        output = self.residual_dropout(output, training=training)
        y = x + output if self.pre_norm else self.norm(x + output)
        return y if extra is None else (y, extra)

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, pre_norm=self.pre_norm, layer_norm_epsilon=self.layer_norm_epsilon)
        return config

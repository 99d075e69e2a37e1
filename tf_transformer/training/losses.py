"""Label-smoothed cross-entropy and token metrics (paper section 5.4)."""

from __future__ import annotations

import keras
from keras import ops

PAD_ID = 0


def _token_nll(labels, logits):
    """Per-token −log p(label) and log-probabilities, in float32. ``[batch, len]``, ``[batch, len, vocab]``."""
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # [batch, len, vocab]
    labels = ops.cast(labels, "int32")
    picked = ops.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # [batch, len]
    return -picked, log_probs


@keras.saving.register_keras_serializable(package="tf_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against ``(1 − ε)·one_hot + ε/V``, averaged over non-padding tokens.

    Section 5.4: "During training, we employed label smoothing of value
    ε_ls = 0.1 [Szegedy et al.]. This hurts perplexity, as the model learns to
    be more unsure, but improves accuracy and BLEU score." Computed in float32
    whatever the compute dtype; labels equal to ``pad_id`` carry no weight.

    Args:
      label_smoothing: ε_ls.
      pad_id: label id that is ignored.
    """

    def __init__(self, label_smoothing: float = 0.1, pad_id: int = PAD_ID, name="label_smoothed_cross_entropy", **kw):
        super().__init__(name=name, **kw)
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        nll, log_probs = _token_nll(y_true, y_pred)  # [batch, len], [batch, len, vocab]
        if self.label_smoothing:
            uniform = -ops.mean(log_probs, axis=-1)  # [batch, len]: cross-entropy with the uniform distribution
            nll = (1.0 - self.label_smoothing) * nll + self.label_smoothing * uniform
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")  # [batch, len]
        return ops.sum(nll * mask) / ops.maximum(ops.sum(mask), 1.0)

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, pad_id=self.pad_id)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class TokenAccuracy(keras.metrics.Metric):
    """Share of non-padding target tokens whose arg-max prediction is right."""

    def __init__(self, pad_id: int = PAD_ID, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct", dtype="float32")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")  # [batch, len]
        hits = ops.cast(ops.equal(ops.argmax(y_pred, axis=-1), ops.cast(y_true, "int64")), "float32")
        self.correct.assign_add(ops.sum(hits * mask))
        self.total.assign_add(ops.sum(mask))

    def result(self):
        return self.correct / ops.maximum(self.total, 1.0)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="tf_transformer")
class TokenPerplexity(keras.metrics.Metric):
    """exp(mean unsmoothed −log p) over non-padding target tokens (per-subword perplexity)."""

    def __init__(self, pad_id: int = PAD_ID, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.nll = self.add_variable(shape=(), initializer="zeros", name="nll", dtype="float32")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        nll, _ = _token_nll(y_true, y_pred)
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        self.nll.assign_add(ops.sum(nll * mask))
        self.total.assign_add(ops.sum(mask))

    def result(self):
        return ops.exp(self.nll / ops.maximum(self.total, 1.0))

    def reset_state(self):
        self.nll.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}

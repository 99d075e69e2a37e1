"""Label-smoothed cross-entropy and token metrics (paper section 5.4)."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

PAD_ID = 0


def _token_nll(labels, logits):
    """Per-token −log p(label) = logsumexp(logits) − logit(label), ``[batch, len]`` in float32.

    For metrics (no gradient): a gather picks the label's logit, where the fused
    cross-entropy op would also write the whole softmax as its gradient.
    """
    logits = ops.cast(logits, "float32")  # [batch, len, vocab]
    picked = ops.take_along_axis(logits, ops.cast(labels, "int32")[..., None], axis=-1)[..., 0]  # [batch, len]
    return ops.logsumexp(logits, axis=-1) - picked


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
        logits = ops.cast(y_pred, "float32")  # [batch, len, vocab]
        labels = ops.cast(y_true, "int32")  # [batch, len]
        if self.label_smoothing:
            # −Σ q log p with q = (1 − ε)·one_hot + ε/V: (1 − ε)·nll + ε·(−mean log p). One fused
            # op computes it and its gradient (softmax − q); picking log p(label) with a gather
            # instead made the backward pass scatter into the whole [batch, len, vocab] tensor.
            vocab = ops.shape(logits)[-1]
            off = self.label_smoothing / ops.cast(vocab, "float32")
            target = tf.one_hot(labels, vocab, on_value=1.0 - self.label_smoothing + off, off_value=off)
            nll = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)  # [batch, len]
        else:
            nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)  # [batch, len]
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
        nll = _token_nll(y_true, y_pred)
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

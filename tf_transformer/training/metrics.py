"""Token metrics reported beside the loss: accuracy, perplexity and the target tokens counted (for tokens/s).

Accuracy and perplexity are over the tokens the loss's softmax is over: every
token, or for a parser trained over the allowed set (``--tree_loss allowed``)
the tokens the tree constraint allows at each position (``allowed``).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from tf_transformer.constants import PAD_ID
from tf_transformer.training.losses import labels_and_mask, token_statistics


def _over(allowed, labels, logits):
    """``logits`` ``[batch, len, vocab]`` with the tokens ``allowed(labels)`` refuses at −∞ (``None``: as they are)."""
    if allowed is None:
        return logits
    return tf.where(allowed(labels), ops.cast(logits, "float32"), -float("inf"))


def _label_statistics(y_true, y_pred, pad_id, allowed):
    """``(mask, largest logit, log Σ exp(logits − largest), label's logit)``, each ``[batch, len]``.

    Both metrics take them from here, as the same ops as the loss's
    (:func:`~tf_transformer.training.losses.token_statistics`): in a graph the
    three then share one pass over the logits.
    """
    labels, mask = labels_and_mask(y_true, pad_id)  # [batch, len] each
    top, log_normalizer, picked, _, _ = token_statistics(labels, _over(allowed, labels, y_pred))
    return mask, top, log_normalizer, picked


@keras.saving.register_keras_serializable(package="tf_transformer")
class TokenAccuracy(keras.metrics.Metric):
    """Share of non-padding target tokens whose label has the largest logit (a tie for it counts as right).

    Read from the loss's own per-token statistics (the largest logit and the
    label's, :func:`~tf_transformer.training.losses.token_statistics`), which
    a graph computes once for the loss, perplexity and this: an arg-max would be
    another pass over the ``[batch, len, vocab]`` logits, a tenth of a `small`
    training step on a 2-core CPU (docs/design/training.md). It differs from
    the arg-max's share only where the label ties another token for the largest
    logit: rare in float32, less rare for logits computed in bfloat16 (mixed
    precision), whose largest values are coarser.
    """

    def __init__(self, pad_id: int = PAD_ID, name="token_accuracy", allowed=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.allowed = allowed  # labels → bool[batch, len, vocab], or None: every token
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct", dtype="float32")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask, top, _, picked = _label_statistics(y_true, y_pred, self.pad_id, self.allowed)  # [batch, len] each
        hits = ops.cast(picked >= top, "float32")  # [batch, len]
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

    def __init__(self, pad_id: int = PAD_ID, name="perplexity", allowed=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.allowed = allowed  # labels → bool[batch, len, vocab], or None: every token
        self.nll = self.add_variable(shape=(), initializer="zeros", name="nll", dtype="float32")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask, top, log_normalizer, picked = _label_statistics(y_true, y_pred, self.pad_id, self.allowed)
        nll = log_normalizer - (picked - top)  # −log p(label), [batch, len]
        self.nll.assign_add(ops.sum(nll * mask))
        self.total.assign_add(ops.sum(mask))

    def result(self):
        return ops.exp(self.nll / ops.maximum(self.total, 1.0))

    def reset_state(self):
        self.nll.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


class TargetTokens(keras.metrics.Metric):
    """Counts non-padding target tokens (for tokens/s)."""

    def __init__(self, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", name="count", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(tf.reduce_sum(tf.cast(tf.not_equal(y_true, 0), tf.float32)))

    def result(self):
        # The value now, not the variable: Keras keeps the result in the epoch's logs and then
        # resets the variable for validation, which would overwrite the training count.
        return tf.identity(self.count)

    def reset_state(self):
        self.count.assign(0.0)

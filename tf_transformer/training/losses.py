"""Label-smoothed cross-entropy (paper section 5.4); the token metrics beside it are in :mod:`.metrics`."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from tf_transformer.constants import PAD_ID


def token_statistics(labels, logits):
    """Per token: the largest logit, log Σ exp(logits − max) and the label's logit, each ``[batch, len]``.

    Also returns ``exp(logits − max)`` and its sum (``[batch, len, vocab]``, ``[batch, len, 1]``),
    which the loss's gradient reuses. Float32 whatever the logits' dtype; ``labels`` must
    lie in ``[0, vocab)`` (see ``labels_and_mask``). The loss and the token perplexity
    call this on the same logits; inside a graph (``fit``, ``tf.function``, XLA)
    TensorFlow merges the identical ops, so perplexity costs no further pass over the
    ``[batch, len, vocab]`` logits. (Run eagerly, each caller pays for its own.)
    """
    logits = ops.cast(logits, "float32")  # [batch, len, vocab]
    labels = ops.cast(labels, "int32")  # [batch, len]
    top = tf.reduce_max(logits, axis=-1, keepdims=True)  # [batch, len, 1]
    shifted = tf.exp(logits - top)  # [batch, len, vocab]
    normalizer = tf.reduce_sum(shifted, axis=-1, keepdims=True)  # [batch, len, 1]
    log_normalizer = tf.math.log(normalizer)[..., 0]  # [batch, len]
    picked = tf.gather(logits, labels, batch_dims=labels.shape.rank)  # [batch, len]
    return top[..., 0], log_normalizer, picked, shifted, normalizer


def labels_and_mask(y_true, pad_id):
    """``(labels, mask)``: padding positions get label 0 (so any ``pad_id`` is a valid index), mask 1.0 elsewhere."""
    labels = ops.cast(y_true, "int32")  # [batch, len]
    keep = ops.not_equal(labels, pad_id)  # [batch, len]
    return ops.where(keep, labels, 0), ops.cast(keep, "float32")


def label_smoothed_nll(labels, logits, label_smoothing: float, allowed=None):
    """Per-token −Σ_j q_j log p_j with q = (1 − ε)·one_hot(label) + ε/V, ``[batch, len]`` float32.

    Written out as log Σ exp(z − m) − (1 − ε)·(z_label − m) − ε·(mean_j z_j − m), with
    m the largest logit (log Σ exp(z) − (1 − ε)·z_label − (ε/V)·Σ_j z_j without the
    cancellation of large terms), and with the gradient ``softmax − q`` given directly:
    the exponentials of the forward pass are reused and the label's term is subtracted
    at one position per token. Faster than ``tf.nn.softmax_cross_entropy_with_logits``
    against a one-hot target, which also needs that ``[batch, len, vocab]`` target built
    (docs/design/training.md), and it shares its passes with the token perplexity (see
    ``token_statistics``). ``labels`` must lie in ``[0, vocab)``.

    ``allowed`` ``bool[batch, len, vocab]`` (holding each label) limits p and q to
    the tokens it allows: the softmax is over them and ε is spread over them, so a
    position where one token is allowed costs nothing (:class:`TreeCrossEntropy`).
    """
    labels = ops.cast(labels, "int32")  # [batch, len]

    @tf.custom_gradient
    def smoothed(logits):  # [batch, len, vocab] float32
        scored = logits if allowed is None else tf.where(allowed, logits, -float("inf"))
        top, log_normalizer, picked, shifted, normalizer = token_statistics(labels, scored)
        loss = log_normalizer - (1.0 - label_smoothing) * (picked - top)  # [batch, len]
        if allowed is None:
            spread = 1.0 / tf.cast(tf.shape(logits)[-1], tf.float32)  # ε's share of each token
            mean = tf.reduce_mean(logits, axis=-1)  # [batch, len]
        else:
            spread = tf.cast(allowed, tf.float32) / tf.reduce_sum(tf.cast(allowed, tf.float32), -1, keepdims=True)
            mean = tf.reduce_sum(tf.where(allowed, logits, 0.0) * spread, axis=-1)  # over the allowed tokens
        if label_smoothing:
            loss -= label_smoothing * (mean - top)
        vocab = tf.shape(logits)[-1]

        def gradient(upstream):  # [batch, len]
            weight = upstream[..., None]  # [batch, len, 1]
            grad = shifted * (weight / normalizer)  # softmax · upstream, [batch, len, vocab]
            if label_smoothing:
                grad -= label_smoothing * spread * weight
            rows = tf.reshape(grad, [-1, vocab])  # [tokens, vocab]
            flat_labels = tf.reshape(labels, [-1])  # [tokens]
            positions = tf.stack([tf.range(tf.shape(flat_labels)[0]), flat_labels], axis=1)  # [tokens, 2]
            label_weight = (1.0 - label_smoothing) * tf.reshape(upstream, [-1])  # [tokens]
            return tf.reshape(tf.tensor_scatter_nd_sub(rows, positions, label_weight), tf.shape(grad))

        return loss, gradient

    return smoothed(ops.cast(logits, "float32"))


@keras.saving.register_keras_serializable(package="tf_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against ``(1 − ε)·one_hot + ε/V``, averaged over the target tokens of the global batch.

    Section 5.4: "During training, we employed label smoothing of value
    ε_ls = 0.1 [Szegedy et al.]. This hurts perplexity, as the model learns to
    be more unsure, but improves accuracy and BLEU score." Computed in float32
    whatever the compute dtype; labels equal to ``pad_id`` carry no weight.

    One update is the mean over the tokens of one global batch, however it is
    cut (section 5.1; :mod:`pipelines.global_batches`):

    * training batches carry ``sample_weight``, one weight per row equal to
      ``1 / T`` for the ``T`` target tokens of the whole update, and the loss is
      ``Σ weight × token loss`` times ``accumulate_steps``, as Keras averages the
      gradients it accumulates. Replicas' gradients are summed (the global
      update, :mod:`.update`), so any cut gives the update of the whole batch;
    * without weights (validation), the token sum is divided by the token count
      summed over the replicas in sync.

    Keras reports a replica's loss times the replica count (it expects each
    replica's loss divided by it), so the loss shown is the batch's mean.

    Args:
      label_smoothing: ε_ls.
      pad_id: label id that is ignored.
      accumulate_steps: micro-batches per update whose gradients the update averages.
    """

    def __init__(
        self,
        label_smoothing: float = 0.1,
        pad_id: int = PAD_ID,
        accumulate_steps: int = 1,
        name="label_smoothed_cross_entropy",
        **kw,
    ):
        super().__init__(name=name, **kw)
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id
        self.accumulate_steps = accumulate_steps

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras's __call__ would apply the weights to the reduced value and divide by the replica count.
        with tf.name_scope(self.name):
            return self.call(y_true, y_pred, sample_weight)

    def token_loss(self, labels, logits):
        """``float32[batch, len]``: each position's loss (padding is masked after)."""
        return label_smoothed_nll(labels, logits, self.label_smoothing)

    def softmax_tokens(self):
        """``labels → bool[batch, len, vocab]``, the tokens the softmax is over at each position (what
        accuracy and perplexity count, :mod:`.metrics`); ``None``: every token."""
        return None

    def call(self, y_true, y_pred, sample_weight=None):
        labels, mask = labels_and_mask(y_true, self.pad_id)  # [batch, len] each
        nll = self.token_loss(labels, y_pred) * mask  # [batch, len]
        if sample_weight is not None:
            weights = ops.cast(ops.reshape(sample_weight, [-1, 1]), "float32")  # [batch, 1]
            return ops.sum(nll * weights) * float(self.accumulate_steps)
        tokens = ops.sum(mask)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            tokens = context.all_reduce(tf.distribute.ReduceOp.SUM, tokens)
        return ops.sum(nll) / ops.maximum(tokens, 1.0)

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, pad_id=self.pad_id, accumulate_steps=self.accumulate_steps)
        return config


class TreeCrossEntropy(LabelSmoothedCrossEntropy):
    """A parser's loss as constrained decoding decodes: nothing on forced tokens, and (``allowed``) the
    softmax over what the search allows.

    At each target position the tree constraint gives what the search would
    allow after the target's earlier tokens
    (:meth:`~tf_transformer.decoding.tree_constraint.TreeConstraint.allowed_along`),
    plus the label itself (a treebank tree may open more constituents in a row
    than the search's cap). A forced token (a word's later pieces, the one
    closing a finished tree allows, EOS) costs nothing: decoding gives the model
    no choice there. Elsewhere ``over="allowed"`` takes the softmax, and spreads
    ε, over the allowed tokens only, so the model spends nothing on what decoding
    never lets it choose; ``over="unforced"`` keeps the whole vocabulary's. The
    loss is still divided by every target token of the update. Not serialized
    with the model (a run's ``tree_loss`` rebuilds it).

    Args:
      constraint: the run's :class:`~tf_transformer.decoding.tree_constraint.TreeConstraint`.
      over: ``"allowed"`` or ``"unforced"`` (:data:`configs.TREE_LOSSES`).
      The rest: :class:`LabelSmoothedCrossEntropy`'s.
    """

    def __init__(
        self,
        constraint,
        label_smoothing: float = 0.1,
        pad_id: int = PAD_ID,
        accumulate_steps: int = 1,
        over: str = "allowed",
    ):
        super().__init__(label_smoothing, pad_id, accumulate_steps, name="tree_cross_entropy")
        if over not in ("allowed", "unforced"):
            raise ValueError(f"over must be allowed or unforced, got {over!r}")
        self.constraint = constraint
        self.over = over

    def allowed(self, labels):
        """``bool[batch, len, vocab]``: what the search allows at each position of ``labels``, and the label."""
        vocab = len(self.constraint.opens)
        return self.constraint.allowed_along(labels) | tf.one_hot(labels, vocab, on_value=True, off_value=False)

    def softmax_tokens(self):
        return self.allowed if self.over == "allowed" else None

    def token_loss(self, labels, logits):
        allowed = self.allowed(labels)  # [batch, len, vocab]
        if self.over == "allowed":
            return label_smoothed_nll(labels, logits, self.label_smoothing, allowed)
        chosen = tf.reduce_sum(tf.cast(allowed, tf.int32), axis=-1) > 1  # [batch, len]: not forced
        return label_smoothed_nll(labels, logits, self.label_smoothing) * tf.cast(chosen, tf.float32)

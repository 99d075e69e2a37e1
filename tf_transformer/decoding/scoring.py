"""The model's log-probability of given targets: one teacher-forced pass, no search.

What fairseq's ``--score-reference``, Marian's ``marian-scorer`` and CTranslate2's
``score_batch`` give: for each (source, target) pair, ``log p(target | source)``
as the decoder computes it during training (section 3.1: the target shifted
right, BOS first), token by token and summed. The sum divided by GNMT's length
penalty of the target's length (EOS counted) is the score beam search ranks
finished hypotheses by (:func:`~tf_transformer.decoding.beam_search.length_penalty`),
so scoring a search's best output gives back the search's score.
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.constants import BOS_ID, PAD_ID
from tf_transformer.decoding.beam_search import length_penalty


def score_ids(model, source_ids, target_ids, alpha, allowed=None):
    """Log-probabilities of ``target_ids`` given ``source_ids`` under ``model``.

    Args:
      model: a :class:`~tf_transformer.model.Transformer`.
      source_ids: ``int32[batch, src_len]``, EOS-terminated, 0-padded.
      target_ids: ``int32[batch, tgt_len]``, EOS-terminated, 0-padded (what a search returns).
      alpha: the length penalty's exponent for ``scores`` (0: none).
      allowed: for a parser whose search renormalizes over the tokens its tree constraint
        allows, ``target_ids → bool[batch, tgt_len, vocab]`` (``TreeConstraint.allowed_along``):
        each softmax is then over them and the target's own token, as that search scores.

    Returns a dict:
      ``token_log_probs``: ``float32[batch, tgt_len]``, each target token's
        log-probability (EOS's included; 0 on padding);
      ``log_probs``: ``float32[batch]``, their sum;
      ``lengths``: ``int32[batch]``, the tokens scored (EOS counted);
      ``scores``: ``float32[batch]``, ``log_probs / ((5 + lengths) / 6) ** alpha``.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    target_ids = tf.convert_to_tensor(target_ids, tf.int32)
    bos = tf.fill([tf.shape(target_ids)[0], 1], BOS_ID)
    decoder_input = tf.concat([bos, target_ids[:, :-1]], axis=1)  # [batch, tgt_len]: BOS + target[:-1]
    memory, memory_mask = model.encode(source_ids, training=False)  # [batch, src_len, d_model]
    logits = tf.cast(model.decode(decoder_input, memory, memory_mask, training=False), tf.float32)
    if allowed is not None:
        vocab = tf.shape(logits)[-1]
        kept = allowed(target_ids) | tf.one_hot(target_ids, vocab, on_value=True, off_value=False)
        logits = tf.where(kept, logits, -1e9)  # [batch, tgt_len, vocab]
    log_softmax = tf.nn.log_softmax(logits, axis=-1)  # [batch, tgt_len, vocab]
    present = target_ids != PAD_ID  # [batch, tgt_len]
    token_log_probs = tf.where(present, tf.gather(log_softmax, target_ids, batch_dims=2), 0.0)  # [batch, tgt_len]
    log_probs = tf.reduce_sum(token_log_probs, axis=1)  # [batch]
    lengths = tf.reduce_sum(tf.cast(present, tf.int32), axis=1)  # [batch]
    return {
        "token_log_probs": token_log_probs,
        "log_probs": log_probs,
        "lengths": lengths,
        "scores": log_probs / length_penalty(lengths, alpha),
    }

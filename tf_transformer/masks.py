"""Attention masks, built once at the top of the model (``True`` = may attend)."""

from __future__ import annotations

from keras import ops

from tf_transformer.constants import PAD_ID


def padding_mask(ids, pad_id: int = PAD_ID):
    """``[batch, 1, 1, len]`` boolean: keys that are real tokens, not padding."""
    return ops.not_equal(ids, pad_id)[:, None, None, :]


def causal_mask(q_len, k_len=None, start_index=0):
    """``[1, 1, q_len, k_len]`` boolean: query i (at ``start_index + i``) sees keys ≤ itself.

    Section 3.2.3: "We … prevent leftward information flow in the decoder … by
    masking out (setting to −∞) all values in the input of the softmax which
    correspond to illegal connections."
    """
    k_len = q_len if k_len is None else k_len
    query_positions = ops.arange(q_len)[:, None] + start_index  # [q_len, 1]
    key_positions = ops.arange(k_len)[None, :]  # [1, k_len]
    return ops.greater_equal(query_positions, key_positions)[None, None, :, :]


def decoder_self_attention_mask(target_ids, pad_id: int = PAD_ID):
    """``[batch, 1, len, len]``: causal and not on padded target keys."""
    length = ops.shape(target_ids)[1]
    return ops.logical_and(causal_mask(length), padding_mask(target_ids, pad_id))

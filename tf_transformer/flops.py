"""Analytic matmul FLOPs of the model, for throughput and MFU reports."""

from __future__ import annotations

from configs import TransformerConfig


def forward_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Multiply-add FLOPs (2 per MAC) of one forward pass on padded ``[batch, len]`` inputs.

    Counts the matmuls: attention projections, attention scores and weighted
    sums, the FFNs and the pre-softmax projection. Element-wise work (softmax,
    LayerNorm, dropout) is ignored, as is usual for MFU.
    """
    d, h, dk, dv, dff = config.d_model, config.num_heads, config.head_key_dim, config.head_value_dim, config.d_ff

    def attention(q_tokens, kv_tokens, q_len, k_len):
        projections = q_tokens * d * h * dk + kv_tokens * d * h * (dk + dv) + q_tokens * h * dv * d
        scores = q_tokens * k_len * h * (dk + dv)
        return projections + scores

    src, tgt = batch * src_len, batch * tgt_len
    ffn = d * dff * 2
    encoder_layer = attention(src, src, src_len, src_len) + src * ffn
    decoder_layer = attention(tgt, tgt, tgt_len, tgt_len) + attention(tgt, src, tgt_len, src_len) + tgt * ffn
    encoder, decoder = config.encoder_depth * encoder_layer, config.decoder_depth * decoder_layer
    logits = tgt * d * config.vocab_size
    return 2 * (encoder + decoder + logits)


def training_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward plus backward (≈ 2× forward): 3× the forward FLOPs."""
    return 3 * forward_flops(config, batch, src_len, tgt_len)

"""Keras 3 layers of the Transformer, one concept per file."""

from tf_transformer.layers.attention import MultiHeadAttention, ScaledDotProductAttention
from tf_transformer.layers.decoder import Decoder, DecoderLayer
from tf_transformer.layers.embedding import SharedEmbedding
from tf_transformer.layers.encoder import Encoder, EncoderLayer, ResidualSublayer
from tf_transformer.layers.feed_forward import PositionwiseFeedForward
from tf_transformer.layers.normalization import LayerNormalization
from tf_transformer.layers.position import LearnedPositionEmbedding, SinusoidalPositionEncoding

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "LayerNormalization",
    "LearnedPositionEmbedding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "ResidualSublayer",
    "ScaledDotProductAttention",
    "SharedEmbedding",
    "SinusoidalPositionEncoding",
]

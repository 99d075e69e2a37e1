"""Keras layers of the Transformer, one per file (section 3)."""

from tf_transformer.layers.attention import MultiHeadAttention, ScaledDotProductAttention
from tf_transformer.layers.decoder import Decoder, DecoderLayer
from tf_transformer.layers.embedding import SharedEmbedding
from tf_transformer.layers.encoder import Encoder, EncoderLayer
from tf_transformer.layers.feed_forward import PositionwiseFeedForward
from tf_transformer.layers.normalization import LayerNormalization
from tf_transformer.layers.position import LearnedPositionEmbedding, SinusoidalPositionEncoding
from tf_transformer.layers.residual import ResidualSublayer
from tf_transformer.layers.stack import LayerStack

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "LayerNormalization",
    "LayerStack",
    "LearnedPositionEmbedding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "ResidualSublayer",
    "ScaledDotProductAttention",
    "SharedEmbedding",
    "SinusoidalPositionEncoding",
]

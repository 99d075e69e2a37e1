"""The Transformer encoder-decoder as one ``keras.Model`` (section 3, Figure 1)."""

from __future__ import annotations

import keras
from keras import ops

from configs import TransformerConfig
from tf_transformer import masks
from tf_transformer.constants import BOS_ID
from tf_transformer.layers.decoder import Decoder
from tf_transformer.layers.embedding import SharedEmbedding
from tf_transformer.layers.encoder import Encoder


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer with tied embeddings (Vaswani et al., 2017).

    One embedding matrix serves the source, the target and the pre-softmax
    projection (section 3.4). With ``shared_embeddings=False`` the source gets
    its own matrix of ``source_vocab_size`` rows and the target embedding stays
    tied to the projection. Id 0 is padding everywhere.

    Args:
      vocab_size: (target, or shared) vocabulary size.
      num_layers, d_model, d_ff, num_heads, key_dim, value_dim, dropout,
      attention_dropout, relu_dropout, position, max_positions, pre_norm,
      layer_norm_epsilon, shared_embeddings, source_vocab_size, activation,
      logits_bias, position_layout, position_timescales, zero_bos_embedding: as in
      :class:`configs.TransformerConfig` (``key_dim``/``value_dim`` are
      required here; the factory :func:`build_transformer` resolves them).

    Call args:
      inputs: ``{"inputs": int[batch, src_len], "targets": int[batch, tgt_len]}``;
        ``targets`` is the decoder input, shifted right (BOS first).
      training: whether dropout is active.

    Returns:
      ``float32[batch, tgt_len, vocab_size]`` logits.

    Inference interface (what :mod:`tf_transformer.inference` reads):
    ``source_embedding``, ``target_embedding`` (``reverse=True`` is the tied
    pre-softmax projection), ``encoder`` and ``decoder`` (their ``position_layer``,
    layers and ``finish``); :meth:`attention_weights` for every layer's weights.
    """

    def __init__(
        self,
        vocab_size: int,
        num_layers: int = 6,
        d_model: int = 512,
        d_ff: int = 2048,
        num_heads: int = 8,
        key_dim: int = 64,
        value_dim: int = 64,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        relu_dropout: float = 0.0,
        position: str = "sinusoidal",
        max_positions: int = 1024,
        pre_norm: bool = False,
        layer_norm_epsilon: float = 1e-6,
        attention_bias: bool = False,
        shared_embeddings: bool = True,
        source_vocab_size: int | None = None,
        activation: str = "relu",
        logits_bias: bool = False,
        position_layout: str = "interleaved",
        position_timescales: str = "paper",
        zero_bos_embedding: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.d_model = d_model
        self.d_ff = d_ff
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.position = position
        self.max_positions = max_positions
        self.pre_norm = pre_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention_bias = attention_bias
        self.shared_embeddings = shared_embeddings
        self.source_vocab_size = source_vocab_size
        self.activation = activation
        self.logits_bias = logits_bias
        self.position_layout = position_layout
        self.position_timescales = position_timescales
        self.zero_bos_embedding = zero_bos_embedding

        policy = self.dtype_policy
        self.target_embedding = SharedEmbedding(
            vocab_size,
            d_model,
            logits_bias=logits_bias,
            zero_ids=(BOS_ID,) if zero_bos_embedding else (),
            dtype=policy,
            name="shared_embedding",
        )
        if shared_embeddings:
            self.source_embedding = self.target_embedding
        else:
            self.source_embedding = SharedEmbedding(
                source_vocab_size or vocab_size, d_model, dtype=policy, name="source_embedding"
            )
        stack = dict(
            num_layers=num_layers,
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            d_ff=d_ff,
            dropout=dropout,
            attention_dropout=attention_dropout,
            relu_dropout=relu_dropout,
            pre_norm=pre_norm,
            layer_norm_epsilon=layer_norm_epsilon,
            attention_bias=attention_bias,
            position=position,
            max_positions=max_positions,
            activation=activation,
            position_layout=position_layout,
            position_timescales=position_timescales,
            dtype=policy,
        )
        self.encoder = Encoder(**stack, name="encoder")
        self.decoder = Decoder(**stack, name="decoder")

    def encode(self, source_ids, training=None):
        """Runs the encoder: returns ``(memory [batch, src_len, d_model], mask [batch, 1, 1, src_len])``."""
        memory_mask = masks.padding_mask(source_ids)  # [batch, 1, 1, src_len]
        embedded = self.source_embedding(source_ids)  # [batch, src_len, d_model]
        memory = self.encoder(embedded, padding_mask=memory_mask, training=training)  # [batch, src_len, d_model]
        return memory, memory_mask

    def decode(self, target_ids, memory, memory_mask, training=None):
        """Runs the decoder on ``target_ids`` (BOS first); returns float32 logits ``[batch, tgt_len, vocab]``."""
        self_mask = masks.decoder_self_attention_mask(target_ids)  # [batch, 1, tgt_len, tgt_len]
        embedded = self.target_embedding(target_ids)  # [batch, tgt_len, d_model]
        hidden = self.decoder(
            embedded, memory, self_attention_mask=self_mask, memory_mask=memory_mask, training=training
        )  # [batch, tgt_len, d_model]
        return self.target_embedding(hidden, reverse=True)  # [batch, tgt_len, vocab]

    def call(self, inputs, training=None):
        memory, memory_mask = self.encode(inputs["inputs"], training=training)
        return self.decode(inputs["targets"], memory, memory_mask, training=training)

    def attention_weights(self, inputs):
        """The forward pass of :meth:`call` (no dropout) with every attention layer's weights.

        ``inputs`` as for :meth:`call`. Returns ``(logits, weights)`` with
        ``weights = {"encoder": [{"self_attention": [batch, heads, src_len,
        src_len]}, …], "decoder": [{"self_attention": [batch, heads, tgt_len,
        tgt_len], "cross_attention": [batch, heads, tgt_len, src_len]}, …]}``,
        one dict per layer, float32 or the compute dtype; each row sums to 1
        and masked keys (padding, later positions) have weight 0. These are
        what figures 3–5 of the paper draw.
        """
        source_ids, target_ids = inputs["inputs"], inputs["targets"]
        memory_mask = masks.padding_mask(source_ids)  # [batch, 1, 1, src_len]
        memory, encoder_weights = self.encoder(
            self.source_embedding(source_ids), padding_mask=memory_mask, training=False, return_attention_scores=True
        )  # memory: [batch, src_len, d_model]
        hidden, decoder_weights = self.decoder(
            self.target_embedding(target_ids),
            memory,
            self_attention_mask=masks.decoder_self_attention_mask(target_ids),
            memory_mask=memory_mask,
            training=False,
            return_attention_scores=True,
        )  # hidden: [batch, tgt_len, d_model]
        logits = self.target_embedding(hidden, reverse=True)  # [batch, tgt_len, vocab]
        return logits, {"encoder": encoder_weights, "decoder": decoder_weights}

    def build_for_shapes(self, src_len: int = 2, tgt_len: int = 2):
        """Creates every weight by running one tiny forward pass."""
        ids = {"inputs": ops.ones((1, src_len), "int32"), "targets": ops.ones((1, tgt_len), "int32")}
        self(ids, training=False)
        return self

    def get_config(self):
        # Hyper-parameters only (no super(): keras.Model's base config holds just
        # name/trainable/dtype, which we add explicitly).
        return dict(
            name=self.name,
            trainable=self.trainable,
            dtype=keras.dtype_policies.serialize(self.dtype_policy),
            vocab_size=self.vocab_size,
            num_layers=self.num_layers,
            d_model=self.d_model,
            d_ff=self.d_ff,
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            relu_dropout=self.relu_dropout,
            position=self.position,
            max_positions=self.max_positions,
            pre_norm=self.pre_norm,
            layer_norm_epsilon=self.layer_norm_epsilon,
            attention_bias=self.attention_bias,
            shared_embeddings=self.shared_embeddings,
            source_vocab_size=self.source_vocab_size,
            activation=self.activation,
            logits_bias=self.logits_bias,
            position_layout=self.position_layout,
            position_timescales=self.position_timescales,
            zero_bos_embedding=self.zero_bos_embedding,
        )

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def build_transformer(config: TransformerConfig, dtype=None, build: bool = True) -> Transformer:
    """The one factory: a :class:`Transformer` for ``config`` (weights created when ``build``).

    ``dtype`` is a Keras dtype policy name (``"mixed_bfloat16"`` …); ``None``
    uses the global policy.
    """
    model = Transformer(
        vocab_size=config.vocab_size,
        num_layers=config.num_layers,
        d_model=config.d_model,
        d_ff=config.d_ff,
        num_heads=config.num_heads,
        key_dim=config.head_key_dim,
        value_dim=config.head_value_dim,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        relu_dropout=config.relu_dropout,
        position=config.position,
        max_positions=config.max_positions,
        pre_norm=config.pre_norm,
        layer_norm_epsilon=config.layer_norm_epsilon,
        attention_bias=config.attention_bias,
        shared_embeddings=config.shared_embeddings,
        source_vocab_size=None if config.shared_embeddings else config.encoder_vocab_size,
        activation=config.activation,
        logits_bias=config.logits_bias,
        position_layout=config.position_layout,
        position_timescales=config.position_timescales,
        zero_bos_embedding=config.zero_bos_embedding,
        dtype=dtype,
        name=f"transformer_{config.name}",
    )
    if build:
        model.build_for_shapes()
    return model

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
      config: the model's frozen :class:`configs.TransformerConfig`, passed whole;
        each layer is handed the fields it uses. :meth:`get_config` writes its
        dict and :meth:`from_config` reads it, so a saved model rebuilds from it.

    Call args:
      inputs: ``{"inputs": int[batch, src_len], "targets": int[batch, tgt_len]}``;
        ``targets`` is the decoder input, shifted right (BOS first).
      training: whether dropout is active.

    Returns:
      ``float32[batch, tgt_len, vocab_size]`` logits.

    Inference interface (what :mod:`tf_transformer.inference` reads):
    ``config``, ``source_embedding``, ``target_embedding`` (``reverse=True`` is the
    tied pre-softmax projection), ``encoder`` and ``decoder`` (their
    ``position_layer``, layers and ``finish``); :meth:`attention_weights` for every
    layer's weights.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        policy = self.dtype_policy
        self.target_embedding = SharedEmbedding(
            config.vocab_size,
            config.d_model,
            logits_bias=config.logits_bias,
            zero_ids=(BOS_ID,) if config.zero_bos_embedding else (),
            dtype=policy,
            name="shared_embedding",
        )
        if config.shared_embeddings:
            self.source_embedding = self.target_embedding
        else:
            self.source_embedding = SharedEmbedding(
                config.encoder_vocab_size, config.d_model, dtype=policy, name="source_embedding"
            )
        stack = dict(
            num_heads=config.num_heads,
            key_dim=config.head_key_dim,
            value_dim=config.head_value_dim,
            d_ff=config.d_ff,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            relu_dropout=config.relu_dropout,
            pre_norm=config.pre_norm,
            layer_norm_epsilon=config.layer_norm_epsilon,
            attention_bias=config.attention_bias,
            position=config.position,
            max_positions=config.max_positions,
            activation=config.activation,
            position_layout=config.position_layout,
            position_timescales=config.position_timescales,
            dtype=policy,
        )
        self.encoder = Encoder(num_layers=config.encoder_depth, **stack, name="encoder")
        self.decoder = Decoder(num_layers=config.decoder_depth, **stack, name="decoder")

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
        # The frozen config's dict (keras-hub's backbones do the same), with Keras' name, trainable and dtype.
        return dict(
            name=self.name,
            trainable=self.trainable,
            dtype=keras.dtype_policies.serialize(self.dtype_policy),
            config=self.config.to_dict(),
        )

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)


def build_transformer(config: TransformerConfig, dtype=None, build: bool = True) -> Transformer:
    """The one factory: a :class:`Transformer` for ``config`` (weights created when ``build``).

    ``dtype`` is a Keras dtype policy name (``"mixed_bfloat16"`` …); ``None``
    uses the global policy.
    """
    model = Transformer(config, dtype=dtype, name=f"transformer_{config.name}")
    if build:
        model.build_for_shapes()
    return model

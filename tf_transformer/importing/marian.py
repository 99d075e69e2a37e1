"""An OPUS-MT model (a Marian Transformer in Hugging Face's layout) as a run directory of ours.

Hugging Face's directory holds ``config.json``, ``model.safetensors`` or
``pytorch_model.bin``, ``source.spm``, ``target.spm`` and ``vocab.json``. The
model is the paper's post-LN Transformer (section 3) with Marian's choices, each
a config field (:class:`configs.TransformerConfig`): a swish feed-forward, biases
in the attention projections, a bias on the logits, sinusoids laid out
``[sin | cos]``, and a decoder that starts from a zero vector; the vocabulary
becomes ours as :mod:`tf_transformer.importing.vocabulary` says.

Positions follow the frequencies the checkpoint was trained with. OPUS-MT models
were trained by Marian's C++, whose sinusoids turn at exp(−i·ln 10000/(d/2 − 1))
(``position_timescales="tensor2tensor"``); Hugging Face's port computes
1/10000^(2i/d) (``"paper"``), slightly different for every channel but the
first: ``position_timescales="paper"`` reproduces the port's outputs instead
(docs/importing.md).

What the import cannot represent it refuses with the reason: pre-norm layers,
learned positions, normalized embeddings, unscaled embeddings, untied output
projections, encoder and decoder of different shapes, separate source and target
vocabularies.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from configs import TransformerConfig
from tf_transformer.constants import BOS_ID, PAD_ID
from tf_transformer.importing.vocabulary import IdMap, VocabularyError, id_map, read_vocab_json, renumbered_model

# Hugging Face's activation names → ours (configs.transformer.ACTIVATIONS).
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's, which Hugging Face's Marian layers use
# Padding and BOS are no entries of Marian's softmax (the port's padding row is an artefact of the port): their
# logits get this bias, so that their probability vanishes (e^-100 < 1e-43) and every log-probability is Marian's,
# while the logits stay finite for label smoothing's mean over the vocabulary and in float16.
ABSENT_LOGIT_BIAS = -100.0


class ModelImportError(ValueError):
    """A model directory the import cannot use: the file, and why."""


@dataclasses.dataclass
class MarianCheckpoint:
    """What an OPUS-MT directory holds, read."""

    directory: str
    config: dict
    weights: dict[str, np.ndarray]
    source_spm: bytes
    target_spm: bytes
    ids: IdMap
    config_file: str = ""  # where ``config`` was read (errors name it); config.json if empty
    weights_file: str = ""  # where ``weights`` were read; model.safetensors if empty
    layer_norm_epsilon: float = LAYER_NORM_EPSILON
    format: str = "huggingface-marian"

    def __post_init__(self):
        self.config_file = self.config_file or os.path.join(self.directory, "config.json")
        self.weights_file = self.weights_file or os.path.join(self.directory, "model.safetensors")


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ModelImportError(f"{path} not found: is {os.path.dirname(path)!r} an OPUS-MT model directory?") from None
    except (OSError, json.JSONDecodeError) as error:
        raise ModelImportError(f"{path}: cannot read it as JSON ({error})") from None


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise ModelImportError(f"{path}: cannot read it ({error.strerror or error})") from None


def read_weights(directory: str) -> tuple[dict[str, np.ndarray], str]:
    """``(state dict, file)``: the state dict of ``model.safetensors`` (or else ``pytorch_model.bin``, which needs
    torch) as float32 arrays, and the file it was read from."""
    safetensors_path = os.path.join(directory, "model.safetensors")
    torch_path = os.path.join(directory, "pytorch_model.bin")
    if os.path.exists(safetensors_path):
        from safetensors.numpy import load_file

        try:
            weights = load_file(safetensors_path)
        except Exception as error:  # the library raises its own error types for a damaged file
            raise ModelImportError(f"{safetensors_path}: cannot read it ({error})") from None
        return {name: np.asarray(value, np.float32) for name, value in weights.items()}, safetensors_path
    if os.path.exists(torch_path):
        try:
            import torch
        except ModuleNotFoundError:
            raise ModelImportError(
                f"{torch_path} is a PyTorch pickle, which needs torch to read: pip install torch, "
                "or convert it to model.safetensors"
            ) from None
        state = torch.load(torch_path, map_location="cpu", weights_only=True)
        return {name: value.float().numpy() for name, value in state.items()}, torch_path
    raise ModelImportError(f"{directory} holds neither model.safetensors nor pytorch_model.bin")


def read_checkpoint(directory: str) -> MarianCheckpoint:
    """Reads an OPUS-MT model directory in Hugging Face's layout (nothing from the network)."""
    config = _read_json(os.path.join(directory, "config.json"))
    if os.path.exists(os.path.join(directory, "target_vocab.json")) or not config.get(
        "share_encoder_decoder_embeddings", True
    ):
        raise ModelImportError(
            f"{directory}: separate source and target vocabularies (target_vocab.json) are not supported: "
            "the model ties one embedding to both sides"
        )
    vocab_path = os.path.join(directory, "vocab.json")
    try:
        ids = id_map(read_vocab_json(vocab_path), vocab_path, int(config["pad_token_id"]), int(config["eos_token_id"]))
    except KeyError as error:
        raise ModelImportError(f"{os.path.join(directory, 'config.json')}: no {error.args[0]}") from None
    except VocabularyError as error:
        raise ModelImportError(str(error)) from None
    weights, weights_file = read_weights(directory)
    return MarianCheckpoint(
        directory=directory,
        config=config,
        weights=weights,
        weights_file=weights_file,
        source_spm=read_bytes(os.path.join(directory, "source.spm")),
        target_spm=read_bytes(os.path.join(directory, "target.spm")),
        ids=ids,
    )


def transformer_config(checkpoint: MarianCheckpoint, position_timescales: str = "tensor2tensor") -> TransformerConfig:
    """Our config of the checkpoint's model; refuses (:class:`ModelImportError`) what it cannot represent."""
    config, path = checkpoint.config, checkpoint.config_file

    def refuse(why):
        raise ModelImportError(f"{path}: {why}; the import supports Marian's post-LN Transformer with sinusoids")

    if config.get("model_type") != "marian":
        refuse(f"model_type is {config.get('model_type')!r}, not 'marian'")
    for key, unsupported in (
        ("normalize_before", True),
        ("normalize_embedding", True),
        ("add_final_layer_norm", True),
        ("static_position_embeddings", False),
        ("scale_embedding", False),
    ):
        if config.get(key, not unsupported) == unsupported:
            refuse(f"{key} is {unsupported} (not supported)")
    for ours, encoder, decoder in (
        ("num_layers", "encoder_layers", "decoder_layers"),
        ("d_ff", "encoder_ffn_dim", "decoder_ffn_dim"),
        ("num_heads", "encoder_attention_heads", "decoder_attention_heads"),
    ):
        if config.get(encoder) != config.get(decoder):
            refuse(f"{encoder} {config.get(encoder)} differs from {decoder} {config.get(decoder)} (one {ours} here)")
    activation = config.get("activation_function", "swish")
    if activation not in ACTIVATIONS:
        refuse(f"activation_function {activation!r} is none of {', '.join(ACTIVATIONS)}")
    vocab_size = config.get("decoder_vocab_size") or config.get("vocab_size")
    pieces = checkpoint.ids.size - (checkpoint.ids.rows[2] is None)  # vocab.json's (ours may add BOS)
    if vocab_size != pieces:
        refuse(f"vocab_size {vocab_size} differs from vocab.json's {pieces} pieces")
    try:
        return TransformerConfig(
            name="marian",
            num_layers=config["encoder_layers"],
            d_model=config["d_model"],
            d_ff=config["encoder_ffn_dim"],
            num_heads=config["encoder_attention_heads"],
            dropout=config.get("dropout", 0.1),
            attention_dropout=config.get("attention_dropout", 0.0),
            relu_dropout=config.get("activation_dropout", 0.0),
            max_positions=config.get("max_position_embeddings", 512),
            max_train_length=config.get("max_position_embeddings", 512),
            layer_norm_epsilon=checkpoint.layer_norm_epsilon,
            attention_bias=True,
            vocab_size=checkpoint.ids.size,
            activation=ACTIVATIONS[activation],
            logits_bias=True,
            position_layout="halves",
            position_timescales=position_timescales,
            zero_bos_embedding=True,
            beam_size=config.get("num_beams") or 4,
        )
    except KeyError as error:
        refuse(f"no {error.args[0]}")
    except ValueError as error:
        refuse(str(error))


def _prefix(weights: dict) -> str:
    """``model.`` for a ``MarianMTModel``'s state dict, nothing for a bare ``MarianModel``'s."""
    return "model." if any(name.startswith("model.") for name in weights) else ""


def our_weights(checkpoint: MarianCheckpoint, config: TransformerConfig) -> dict[str, np.ndarray]:
    """Our weight paths (``transformer_marian/…``, as :func:`tf_transformer.model.build_transformer` names
    them) → arrays, from the checkpoint's state dict."""
    weights, prefix = checkpoint.weights, _prefix(checkpoint.weights)
    where = checkpoint.weights_file

    def get(name, shape=None):
        if name not in weights:
            raise ModelImportError(f"{where}: no weight {name}")
        value = weights[name]
        if shape is not None and value.shape != tuple(shape):
            raise ModelImportError(f"{where}: {name} has shape {value.shape}, expected {tuple(shape)}")
        return value

    embedding_name = prefix + "shared.weight"
    if embedding_name not in weights:
        embedding_name = prefix + "decoder.embed_tokens.weight"
    embedding = get(embedding_name)
    if "lm_head.weight" in weights and not np.array_equal(weights["lm_head.weight"], embedding):
        raise ModelImportError(
            f"{where}: lm_head.weight is not the shared embedding (untied projections are not supported)"
        )
    rows = checkpoint.ids.rows
    d, width = config.d_model, config.d_ff
    ours = {}
    zero = np.zeros((d,), np.float32)
    ours["shared_embedding/embeddings"] = np.stack([embedding[r] if r is not None else zero for r in rows])
    bias = weights.get("final_logits_bias", np.zeros((1, embedding.shape[0]), np.float32)).reshape(-1)
    bias = np.array([bias[r] if r is not None else 0.0 for r in rows], np.float32)
    bias[[PAD_ID, BOS_ID]] = ABSENT_LOGIT_BIAS
    ours["shared_embedding/logits_bias"] = bias

    def linear(ours_name, theirs):
        ours[f"{ours_name}/kernel"] = get(f"{theirs}.weight").T  # torch's [out, in] → Keras' [in, out]
        ours[f"{ours_name}/bias"] = get(f"{theirs}.bias")

    def norm(ours_name, theirs):
        ours[f"{ours_name}/norm/gamma"] = get(f"{theirs}.weight", (d,))
        ours[f"{ours_name}/norm/beta"] = get(f"{theirs}.bias", (d,))

    def attention(ours_name, theirs):
        for ours_part, their_part in (
            ("query", "q_proj"),
            ("key", "k_proj"),
            ("value", "v_proj"),
            ("output", "out_proj"),
        ):
            linear(f"{ours_name}/{ours_part}", f"{theirs}.{their_part}")

    for side in ("encoder", "decoder"):
        for index in range(config.num_layers):
            ours_layer, theirs = f"{side}/layer_{index}", f"{prefix}{side}.layers.{index}"
            attention(f"{ours_layer}/self_attention", f"{theirs}.self_attn")
            norm(f"{ours_layer}/self_attention_residual", f"{theirs}.self_attn_layer_norm")
            if side == "decoder":
                attention(f"{ours_layer}/cross_attention", f"{theirs}.encoder_attn")
                norm(f"{ours_layer}/cross_attention_residual", f"{theirs}.encoder_attn_layer_norm")
            linear(f"{ours_layer}/feed_forward/inner", f"{theirs}.fc1")
            linear(f"{ours_layer}/feed_forward/outer", f"{theirs}.fc2")
            norm(f"{ours_layer}/feed_forward_residual", f"{theirs}.final_layer_norm")
        if get(f"{prefix}{side}.layers.0.fc1.weight").shape != (width, d):
            raise ModelImportError(f"{where}: {side} feed-forward weights are not {width} × {d}")
    return ours


def load_into(model, checkpoint: MarianCheckpoint, config: TransformerConfig) -> None:
    """Sets every weight of ``model`` (built from ``config``) from the checkpoint; strict both ways."""
    values = our_weights(checkpoint, config)
    prefix = f"{model.name}/"
    paths = {weight.path.removeprefix(prefix): weight for weight in model.weights}
    missing, unused = sorted(set(paths) - set(values)), sorted(set(values) - set(paths))
    if missing or unused:
        raise ModelImportError(f"{checkpoint.directory}: weights do not match (missing {missing}, unused {unused})")
    for path, weight in paths.items():
        if tuple(weight.shape) != values[path].shape:
            raise ModelImportError(
                f"{checkpoint.directory}: {path} has shape {values[path].shape}, the model's is {tuple(weight.shape)}"
            )
        weight.assign(values[path])


def vocabulary_models(checkpoint: MarianCheckpoint) -> tuple[bytes, bytes]:
    """``(sp.model, sp.target.model)``: the checkpoint's SentencePiece models renumbered to our ids."""
    directory = checkpoint.directory
    try:
        return (
            renumbered_model(checkpoint.source_spm, checkpoint.ids, os.path.join(directory, "source.spm")),
            renumbered_model(checkpoint.target_spm, checkpoint.ids, os.path.join(directory, "target.spm")),
        )
    except VocabularyError as error:
        raise ModelImportError(str(error)) from None
    except Exception as error:  # protobuf's DecodeError: not a SentencePiece model
        raise ModelImportError(
            f"{directory}: source.spm or target.spm is not a SentencePiece model ({error})"
        ) from None

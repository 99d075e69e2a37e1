"""An OPUS-MT model in Marian's own layout, read as the checkpoint :mod:`tf_transformer.importing.marian` imports.

An OPUS-MT release (the zip Marian users download) holds ``decoder.yml``, the
model (``*.npz``, its options stored inside as ``special:model.yml``), the
vocabulary (``*.vocab.yml``, piece → id) and the SentencePiece models
``source.spm`` and ``target.spm``. This module reads them and names the weights
and options as Hugging Face's port of the same model does, so that one
validation, config and weight mapping serve both layouts. The names follow
Marian's transformer (``src/models/transformer.h``): layer ``l`` (from 1) of a
side holds ``{side}_l{l}_self_Wq`` … ``_Wo_ln_scale`` (self-attention and its
layer norm), ``decoder_l{l}_context_*`` (encoder–decoder attention) and
``{side}_l{l}_ffn_W1`` … ``_ffn_ffn_ln_bias``; ``Wemb`` is the embedding shared
by both sides and the output projection, ``decoder_ff_logit_out_b`` the logits'
bias. Marian stores matrices ``[in, out]`` and biases ``[1, out]``.

What differs from Hugging Face's port:

- Marian has no padding piece (it masks): a zero ``<pad>`` row is added after
  the vocabulary, as the port does; the model never outputs it.
- Marian's layer norm adds ε = 1e-6 to the variance (``src/layers/generic.h``);
  the port uses torch's 1e-5. The import of this layout follows Marian.

Options the model cannot be imported with are refused by their Marian names
(``--transformer-preprocess n`` and the like), as are weights the import does
not know.
"""

from __future__ import annotations

import glob
import os
import re
import zipfile

import numpy as np

from tf_transformer.importing.marian import ACTIVATIONS, MarianCheckpoint, ModelImportError, read_bytes
from tf_transformer.importing.vocabulary import PAD_PIECE, VocabularyError, id_map, read_vocab_yml

DECODER_CONFIG = "decoder.yml"
MODEL_OPTIONS = "special:model.yml"  # the npz entry holding the model's options, a NUL-terminated YAML text
LAYER_NORM_EPSILON = 1e-6  # Marian's, src/layers/generic.h

# Marian's names of a layer's parts (after ``{side}_l{l}_``) → Hugging Face's (after ``{side}.layers.{l-1}.``).
_ATTENTION = {"self": "self_attn", "context": "encoder_attn"}
_PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
_FEED_FORWARD = {"W1": "fc1.weight", "b1": "fc1.bias", "W2": "fc2.weight", "b2": "fc2.bias"}


def is_marian_directory(directory: str) -> bool:
    """Whether ``directory`` looks like Marian's layout (``decoder.yml`` or a model ``.npz``)."""
    return os.path.exists(os.path.join(directory, DECODER_CONFIG)) or bool(_models_in(directory))


def _models_in(directory: str) -> list[str]:
    """The model files in ``directory``, leaving out the optimizer states Marian's training writes beside them."""
    return sorted(p for p in glob.glob(os.path.join(directory, "*.npz")) if not p.endswith(".optimizer.npz"))


def _read_yaml(path: str):
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError:
        raise ModelImportError(f"{path} not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ModelImportError(f"{path}: cannot read it as YAML ({error})") from None


def _files(directory: str) -> tuple[str, list[str], dict]:
    """``(model, vocabularies, decoder options)``: from ``decoder.yml`` where there is one, else the directory's
    one ``.npz`` and one ``*vocab.yml``."""
    decoder_path = os.path.join(directory, DECODER_CONFIG)
    if os.path.exists(decoder_path):
        options = _read_yaml(decoder_path)
        if not isinstance(options, dict) or not options.get("models") or not options.get("vocabs"):
            raise ModelImportError(f"{decoder_path}: expected the lists 'models' and 'vocabs'")
        models, vocabs = (
            [str(v) for v in ([value] if isinstance(value, str) else value)]
            for value in (options["models"], options["vocabs"])
        )
        if len(models) != 1:
            raise ModelImportError(f"{decoder_path}: an ensemble of {len(models)} models; the import takes one model")
        # Relative to the directory, as OPUS-MT's decoder.yml (relative-paths: true) means them.
        return os.path.join(directory, models[0]), [os.path.join(directory, v) for v in vocabs], options
    models = _models_in(directory)
    vocabs = sorted(glob.glob(os.path.join(directory, "*vocab.yml")))
    if len(models) != 1 or len(vocabs) != 1:
        raise ModelImportError(
            f"{directory}: without {DECODER_CONFIG}, expected one model .npz and one *vocab.yml, found "
            f"{[os.path.basename(p) for p in models]} and {[os.path.basename(p) for p in vocabs]}"
        )
    return models[0], vocabs, {}


def read_model_options(weights: dict, path: str) -> dict:
    """The options Marian stored with the model (``special:model.yml``)."""
    import yaml

    if MODEL_OPTIONS not in weights:
        raise ModelImportError(f"{path}: no {MODEL_OPTIONS} entry: not a model saved by Marian")
    text = np.asarray(weights[MODEL_OPTIONS]).tobytes().rstrip(b"\0")
    try:
        options = yaml.safe_load(text.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise ModelImportError(f"{path}: {MODEL_OPTIONS} is not YAML ({error})") from None
    if not isinstance(options, dict):
        raise ModelImportError(f"{path}: {MODEL_OPTIONS} is not a mapping of options")
    return options


def _check_options(options: dict, path: str) -> None:
    """Refuses, by the option's Marian name, what the import cannot represent."""

    def option(name, default):
        value = options.get(name, default)
        return default if value is None else value

    def refuse(why):
        raise ModelImportError(f"{path}: {why}; the import supports Marian's post-LN Transformer with sinusoids")

    if option("type", "") != "transformer":
        refuse(f"--type {option('type', '')} is not supported (only transformer)")
    layout = (option("transformer-preprocess", ""), option("transformer-postprocess", "dan"))
    if layout != ("", "dan") or option("transformer-postprocess-top", ""):
        refuse(
            "--transformer-preprocess {!r} --transformer-postprocess {!r} --transformer-postprocess-top {!r} is "
            "not supported (pre-norm or another layout; expected '' 'dan' '')".format(
                *layout, option("transformer-postprocess-top", "")
            )
        )
    if "n" in str(option("transformer-postprocess-emb", "d")):
        refuse("--transformer-postprocess-emb with n (layer-normalized embeddings) is not supported")
    if option("transformer-decoder-autoreg", "self-attention") != "self-attention":
        refuse(f"--transformer-decoder-autoreg {option('transformer-decoder-autoreg', '')} is not supported")
    for name, unsupported in (
        ("transformer-train-position-embeddings", "learned positions"),
        ("right-left", "a right-to-left model"),
        ("transformer-no-projection", "attention without its output projection"),
    ):
        if option(name, False):
            refuse(f"--{name} ({unsupported}) is not supported")
    if option("transformer-tied-layers", []):
        refuse("--transformer-tied-layers is not supported")
    if option("transformer-ffn-depth", 2) != 2 or option("transformer-decoder-ffn-depth", 0) not in (0, 2):
        refuse("feed-forward networks of other than two layers are not supported")
    if option("transformer-decoder-dim-ffn", 0) not in (0, option("transformer-dim-ffn", 2048)):
        refuse("--transformer-decoder-dim-ffn differs from --transformer-dim-ffn (one d_ff here)")
    if option("enc-depth", 6) != option("dec-depth", 6):
        refuse(f"--enc-depth {option('enc-depth', 6)} differs from --dec-depth {option('dec-depth', 6)}")
    if option("transformer-ffn-activation", "swish") not in ACTIVATIONS:
        refuse(f"--transformer-ffn-activation {option('transformer-ffn-activation', '')} is not supported")
    if option("transformer-ffn-activation", "swish") == "gelu" and _version(options) < (1, 12, 3):
        refuse(
            f"gelu of Marian {option('version', 'of unknown version')}: before v1.12.3 Marian computed "
            "x·sigmoid(1.702x), not the GELU the import maps to"
        )
    if option("transformer-disable-position-embeddings", False):
        refuse("--transformer-disable-position-embeddings is not supported")
    if option("transformer-attention-mask", "default") != "default":
        refuse(f"--transformer-attention-mask {option('transformer-attention-mask', '')} is not supported")
    if not (
        option("tied-embeddings-all", False)
        or (option("tied-embeddings-src", False) and option("tied-embeddings", False))
    ):
        refuse(
            "the model does not tie one embedding to source, target and output (--tied-embeddings-all): "
            "separate vocabularies and untied projections are not supported"
        )


def _version(options: dict) -> tuple[int, ...]:
    """Marian's version that saved the model (``version: v1.12.3 …``); ``()`` when unknown."""
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)", str(options.get("version", "")))
    return tuple(int(part) for part in found.groups()) if found else ()


def _hugging_face_names(weights: dict, options: dict, path: str) -> dict[str, np.ndarray]:
    """The model's weights under Hugging Face's names (``model.…``, matrices ``[out, in]``), with the zero
    ``<pad>`` row; refuses weights it does not know."""
    unused = {name for name in weights if not name.startswith("special:")}

    def take(name):
        if name not in weights:
            raise ModelImportError(f"{path}: no weight {name}")
        unused.discard(name)
        return np.asarray(weights[name], np.float32)

    embedding = take("Wemb")  # [vocab, d_model]
    bias = take("decoder_ff_logit_out_b").reshape(1, -1)  # [1, vocab]
    if bias.shape[1] != embedding.shape[0]:
        raise ModelImportError(
            f"{path}: decoder_ff_logit_out_b has {bias.shape[1]} logits for {embedding.shape[0]} rows"
        )
    ours = {
        "model.shared.weight": np.concatenate([embedding, np.zeros((1, embedding.shape[1]), np.float32)]),
        "final_logits_bias": np.concatenate([bias, np.zeros((1, 1), np.float32)], axis=1),
    }
    depth = options.get("enc-depth", 6)
    for side in ("encoder", "decoder"):
        for layer in range(1, depth + 1):
            marian, theirs = f"{side}_l{layer}_", f"model.{side}.layers.{layer - 1}."
            for part in ("self", "context") if side == "decoder" else ("self",):
                module = theirs + _ATTENTION[part]
                for x, projection in _PROJECTIONS.items():
                    ours[f"{module}.{projection}.weight"] = take(f"{marian}{part}_W{x}").T  # [out, in]
                    ours[f"{module}.{projection}.bias"] = take(f"{marian}{part}_b{x}").reshape(-1)
                ours[f"{module}_layer_norm.weight"] = take(f"{marian}{part}_Wo_ln_scale").reshape(-1)
                ours[f"{module}_layer_norm.bias"] = take(f"{marian}{part}_Wo_ln_bias").reshape(-1)
            for name, their_name in _FEED_FORWARD.items():
                value = take(f"{marian}ffn_{name}")
                ours[theirs + their_name] = value.T if name.startswith("W") else value.reshape(-1)
            ours[f"{theirs}final_layer_norm.weight"] = take(f"{marian}ffn_ffn_ln_scale").reshape(-1)
            ours[f"{theirs}final_layer_norm.bias"] = take(f"{marian}ffn_ffn_ln_bias").reshape(-1)
    if unused:
        raise ModelImportError(f"{path}: weights the import does not know: {sorted(unused)[:8]}")
    return ours


def read_marian_checkpoint(directory: str) -> MarianCheckpoint:
    """Reads an OPUS-MT model in Marian's layout (nothing from the network)."""
    model_path, vocab_paths, decoder_options = _files(directory)
    if any(p.endswith(".spm") for p in vocab_paths):
        raise ModelImportError(
            f"{os.path.join(directory, DECODER_CONFIG)}: SentencePiece models as Marian vocabularies are not "
            "supported; OPUS-MT releases list a .vocab.yml"
        )
    if len(set(vocab_paths)) != 1:
        raise ModelImportError(
            f"{os.path.join(directory, DECODER_CONFIG)}: separate source and target vocabularies "
            f"({', '.join(map(os.path.basename, vocab_paths))}) are not supported: the model ties one embedding "
            "to both sides"
        )
    try:
        with np.load(model_path, allow_pickle=False) as archive:
            weights = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise ModelImportError(f"{model_path} not found") from None
    except (OSError, ValueError, zipfile.BadZipFile) as error:  # not a zip, or a damaged (cut) one
        raise ModelImportError(f"{model_path}: cannot read it as a Marian model ({error})") from None
    options = read_model_options(weights, model_path)
    _check_options(options, f"{model_path} ({MODEL_OPTIONS})")
    try:
        vocab = read_vocab_yml(vocab_paths[0])
    except VocabularyError as error:
        raise ModelImportError(str(error)) from None
    for piece in ("</s>", "<unk>"):
        if piece not in vocab:
            raise ModelImportError(f"{vocab_paths[0]}: no {piece} piece, which Marian's vocabularies hold")
    pad = len(vocab)
    vocab = {**vocab, PAD_PIECE: pad} if PAD_PIECE not in vocab else vocab
    if vocab[PAD_PIECE] != pad:
        raise ModelImportError(f"{vocab_paths[0]}: a {PAD_PIECE} piece inside the vocabulary is not supported")
    state = _hugging_face_names(weights, options, model_path)
    if state["model.shared.weight"].shape[0] != len(vocab):
        raise ModelImportError(
            f"{model_path}: Wemb has {state['model.shared.weight'].shape[0] - 1} rows, {vocab_paths[0]} "
            f"{len(vocab) - 1} pieces"
        )
    ffn = options.get("transformer-dim-ffn", 2048)
    config = {
        "model_type": "marian",
        "d_model": options.get("dim-emb", 512),
        "encoder_layers": options.get("enc-depth", 6),
        "decoder_layers": options.get("dec-depth", 6),
        "encoder_attention_heads": options.get("transformer-heads", 8),
        "decoder_attention_heads": options.get("transformer-heads", 8),
        "encoder_ffn_dim": ffn,
        "decoder_ffn_dim": options.get("transformer-decoder-dim-ffn") or ffn,
        "activation_function": options.get("transformer-ffn-activation", "swish"),
        "dropout": float(options.get("transformer-dropout", 0.0) or 0.0),  # Marian's defaults: no dropout
        "attention_dropout": float(options.get("transformer-dropout-attention", 0.0) or 0.0),
        "activation_dropout": float(options.get("transformer-dropout-ffn", 0.0) or 0.0),
        "max_position_embeddings": max(512, int(options.get("max-length", 0) or 0)),
        "vocab_size": len(vocab),
        "pad_token_id": pad,
        "eos_token_id": vocab["</s>"],
        "num_beams": decoder_options.get("beam-size"),
    }
    try:
        ids = id_map(vocab, vocab_paths[0], pad, vocab["</s>"])
    except VocabularyError as error:
        raise ModelImportError(str(error)) from None
    spm = {}
    for name in ("source.spm", "target.spm"):
        if not os.path.exists(os.path.join(directory, name)):
            raise ModelImportError(
                f"{os.path.join(directory, name)} not found: Marian's layout needs the release's SentencePiece "
                "models, source.spm and target.spm, beside the model"
            )
        spm[name] = read_bytes(os.path.join(directory, name))
    return MarianCheckpoint(
        directory=directory,
        config=config,
        weights=state,
        source_spm=spm["source.spm"],
        target_spm=spm["target.spm"],
        ids=ids,
        config_file=f"{model_path} ({MODEL_OPTIONS})",
        weights_file=model_path,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        format="marian",
    )

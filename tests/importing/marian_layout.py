"""The committed tiny OPUS-MT model (``tests/fixtures/marian``) written again in Marian's own layout.

An OPUS-MT release holds ``decoder.yml``, the model ``.npz`` (its options inside as ``special:model.yml``), a
``*.vocab.yml`` and the SentencePiece models. This writes that layout from Hugging Face's files by the names
of Hugging Face's converter (``convert_marian_to_pytorch.py``: Marian's matrices are ``[in, out]``, its biases
``[1, out]``, its vocabulary has no ``<pad>``), so that an import from either layout must give the same model;
the slow test checks the written model against CTranslate2's own Marian converter as well.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import numpy as np
import yaml

from tests.importing.test_marian import FIXTURE

MODEL_FILE = "opus.spm32k-spm32k.transformer-align.model1.npz.best-perplexity.npz"
VOCAB_FILE = "opus.spm32k-spm32k.vocab.yml"


def model_options(config: dict, vocab_size: int) -> dict:
    """Marian's options of the fixture's model, as Marian stores them in the ``.npz``."""
    return {
        "type": "transformer",
        "dim-vocabs": [vocab_size, vocab_size],
        "dim-emb": config["d_model"],
        "enc-depth": config["encoder_layers"],
        "dec-depth": config["decoder_layers"],
        "transformer-heads": config["encoder_attention_heads"],
        "transformer-dim-ffn": config["encoder_ffn_dim"],
        "transformer-decoder-dim-ffn": 0,
        "transformer-ffn-depth": 2,
        "transformer-ffn-activation": config["activation_function"],
        "transformer-preprocess": "",
        "transformer-postprocess": "dan",
        "transformer-postprocess-emb": "d",
        "transformer-postprocess-top": "",
        "transformer-decoder-autoreg": "self-attention",
        "transformer-train-position-embeddings": False,
        "transformer-tied-layers": [],
        "transformer-no-projection": False,
        "transformer-guided-alignment-layer": "last",
        "transformer-dropout": 0.1,
        "tied-embeddings": False,
        "tied-embeddings-src": False,
        "tied-embeddings-all": True,
        "right-left": False,
        "max-length": 100,
        "version": "v1.7.6 02f4af4 2018-12-12 18:51:10 -0800",
    }


def _vocab_line(piece: str, index: int) -> str:
    """A line as Marian's YAML writer gives it: the piece plain where YAML allows, else double-quoted."""
    plain = re.fullmatch(r"[\w▁</>]+", piece) and piece not in ("null", "true", "false", "yes", "no")
    return f"{piece if plain else json.dumps(piece, ensure_ascii=False)}: {index}\n"


def write_marian_directory(directory: pathlib.Path, options: dict | None = None, extra_weights: dict | None = None):
    """Writes the fixture's model into ``directory`` in Marian's layout; ``options`` override model options,
    ``extra_weights`` are added to the ``.npz``. Returns ``directory``."""
    from safetensors.numpy import load_file

    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
    vocab = json.loads((FIXTURE / "vocab.json").read_text(encoding="utf-8"))
    pad = config["pad_token_id"]
    assert pad == len(vocab) - 1 and [p for p, i in vocab.items() if i == pad] == ["<pad>"]
    pieces = sorted((i, p) for p, i in vocab.items() if i != pad)
    (directory / VOCAB_FILE).write_text("".join(_vocab_line(p, i) for i, p in pieces), encoding="utf-8")

    state = load_file(str(FIXTURE / "model.safetensors"))
    state = {name.removeprefix("model."): value for name, value in state.items()}
    weights = {
        "Wemb": state["shared.weight"][:pad],
        "decoder_ff_logit_out_b": state["final_logits_bias"][:, :pad],
    }
    for side in ("encoder", "decoder"):
        for layer in range(config[f"{side}_layers"]):
            theirs, marian = f"{side}.layers.{layer}.", f"{side}_l{layer + 1}_"
            for part, module in (("self", "self_attn"), ("context", "encoder_attn")):
                if part == "context" and side == "encoder":
                    continue
                for x, projection in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
                    weights[f"{marian}{part}_W{x}"] = state[f"{theirs}{module}.{projection}.weight"].T
                    weights[f"{marian}{part}_b{x}"] = state[f"{theirs}{module}.{projection}.bias"][None]
                weights[f"{marian}{part}_Wo_ln_scale"] = state[f"{theirs}{module}_layer_norm.weight"][None]
                weights[f"{marian}{part}_Wo_ln_bias"] = state[f"{theirs}{module}_layer_norm.bias"][None]
            for number in (1, 2):
                weights[f"{marian}ffn_W{number}"] = state[f"{theirs}fc{number}.weight"].T
                weights[f"{marian}ffn_b{number}"] = state[f"{theirs}fc{number}.bias"][None]
            weights[f"{marian}ffn_ffn_ln_scale"] = state[f"{theirs}final_layer_norm.weight"][None]
            weights[f"{marian}ffn_ffn_ln_bias"] = state[f"{theirs}final_layer_norm.bias"][None]
    text = yaml.safe_dump({**model_options(config, len(pieces)), **(options or {})}, sort_keys=False)
    weights["special:model.yml"] = np.frombuffer(text.encode("utf-8") + b"\0", np.int8)
    np.savez(
        directory / MODEL_FILE, **{k: np.ascontiguousarray(v) for k, v in weights.items()}, **(extra_weights or {})
    )

    decoder = {"relative-paths": True, "models": [MODEL_FILE], "vocabs": [VOCAB_FILE, VOCAB_FILE], "beam-size": 6}
    (directory / "decoder.yml").write_text(yaml.safe_dump(decoder), encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(FIXTURE / name, directory / name)
    return directory


LANGUAGE_CODES = (">>deu<<", ">>fra<<")


def write_multilingual_directory(directory: pathlib.Path) -> pathlib.Path:
    """The fixture in Hugging Face's layout as a multilingual OPUS-MT model: ``vocab.json`` gains the pieces
    :data:`LANGUAGE_CODES` (which neither SentencePiece model has) and the embedding two random rows."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(FIXTURE, directory)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    for code in LANGUAGE_CODES:
        vocab[code] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config["vocab_size"] = config["decoder_vocab_size"] = len(vocab)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    weights = load_file(str(directory / "model.safetensors"))
    rows = np.random.default_rng(0).normal(0, 0.5, (len(LANGUAGE_CODES), config["d_model"])).astype(np.float32)
    weights["model.shared.weight"] = np.concatenate([weights["model.shared.weight"], rows])
    bias = weights["final_logits_bias"]
    weights["final_logits_bias"] = np.concatenate([bias, np.zeros((1, len(LANGUAGE_CODES)), bias.dtype)], axis=1)
    save_file(weights, str(directory / "model.safetensors"))
    return directory

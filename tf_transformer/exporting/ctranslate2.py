"""Export a trained run to CTranslate2: the same weights, run by CTranslate2's C++ decoder.

``tft-export --format ctranslate2`` fills a ``ctranslate2.specs.TransformerSpec``
(CTranslate2's public specification API) with the run's weights and writes it with
CTranslate2's converter, optionally quantized, into a directory holding:

- ``model.bin`` and ``config.json``: CTranslate2's model;
- ``shared_vocabulary.json`` (or ``source_vocabulary.json`` and
  ``target_vocabulary.json``): the pieces by id, CTranslate2's vocabulary;
- ``sp.model``: the run's SentencePiece model, to turn text into those pieces and back
  (and ``sp.target.model`` when the run's targets have a model of their own, as an
  imported Marian model's do: sources are then segmented with ``sp.model``, outputs
  joined with ``sp.target.model``);
- ``tf_transformer.json``: where the weights came from and the run's decoding settings.

Mapped as trained: tied or separate embeddings and the pre-softmax projection, the
√d_model scale, post-norm or pre-norm (with its final LayerNorm), attention
projections with or without biases, the FFN activation, a logits bias, a decoder
that starts from a zero BOS embedding, and positions: the table is written out
from the model's own position layer (sinusoids of any layout, or learned rows),
so CTranslate2 adds exactly what the model adds. The source gets EOS appended
(``add_source_eos``, as our pipelines append it) and the decoder starts from BOS.
``ctranslate2`` is imported only here, on use: it is an optional package
(``pip install -e '.[reference]'``). How to decode the export as our search does:
docs/ctranslate2.md.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import sentencepiece as spm

from pipelines import target_model_beside
from tf_transformer.constants import BOS_ID, EOS_ID, UNK_ID
from tf_transformer.files import replace_directory, staging_directory, write_failed
from tf_transformer.run_dir import resolve_checkpoint, restore_model, vocabulary_path

# Weight types ``--quantization`` offers (CTranslate2 converts at load time to what the device computes in).
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "bfloat16", "float16")

# The FFN activations by our config's (Keras) name. Keras's "gelu" is the exact, erf-based GELU.
ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}

# Rows of a sinusoidal position table, at least: CTranslate2 truncates sources at 1024 tokens by default
# (``max_input_length``) and refuses positions past the table's end.
SINUSOID_ROWS = 1024

INSTALL_HINT = "pip install -e '.[reference]'"

EXPORT_INFO = "tf_transformer.json"


def import_ctranslate2():
    """The ``ctranslate2`` module, or an ``ImportError`` that says how to install it."""
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            f"Exporting to CTranslate2 needs the ctranslate2 package, which is not installed ({error}): "
            f"install it with {INSTALL_HINT}"
        ) from None
    return ctranslate2


def check_quantization(quantization: str | None) -> None:
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)} (or none), got {quantization!r}")


def export_ctranslate2(
    model_dir: str,
    output: str,
    checkpoint: str | None = None,
    quantization: str | None = None,
    overwrite: bool = False,
) -> str:
    """Writes the run in ``model_dir`` as a CTranslate2 model directory at ``output``, atomically.

    ``checkpoint``: a checkpoint prefix, ``best``, or ``None`` for the run's default
    (:func:`~tf_transformer.run_dir.default_checkpoint`). ``quantization``: one of
    :data:`QUANTIZATIONS`, or ``None`` for float32 weights. An existing ``output``
    is an error unless ``overwrite``; it is then replaced whole (the new model is
    written beside it first, so a failure leaves it as it was). Returns ``output``.
    """
    check_quantization(quantization)
    output = os.path.abspath(output)
    if os.path.exists(output) and not overwrite:
        raise FileExistsError(f"{output} exists: export to a new directory (or pass --overwrite)")
    ctranslate2 = import_ctranslate2()
    source_model = vocabulary_path(model_dir)
    if not os.path.exists(source_model):
        raise FileNotFoundError(f"{source_model} not found: the run's SentencePiece model goes with the export")
    target_model = target_model_beside(source_model)
    target_model = target_model if os.path.exists(target_model) else None
    checkpoint = resolve_checkpoint(model_dir, checkpoint)
    model, config = restore_model(model_dir, checkpoint)
    spec = transformer_spec(
        ctranslate2,
        model,
        source_tokens=vocabulary_tokens(sentencepiece_pieces(source_model), model.source_embedding.vocab_size),
        target_tokens=vocabulary_tokens(
            sentencepiece_pieces(target_model or source_model), model.target_embedding.vocab_size
        ),
    )
    info = {
        "model_dir": os.path.abspath(model_dir),
        "checkpoint": checkpoint,
        "quantization": quantization or "float32",
        "decoding": {"beam_size": config.beam_size, "alpha": config.alpha, "max_extra_length": config.max_extra_length},
    }
    staging = staging_directory(output)
    try:
        written = os.path.join(staging, "model")
        spec_converter(ctranslate2, spec).convert(written, quantization=quantization)
        for path in filter(None, (source_model, target_model)):
            shutil.copyfile(path, os.path.join(written, os.path.basename(path)))
        with open(os.path.join(written, EXPORT_INFO), "w", encoding="utf-8") as handle:
            json.dump(info, handle, indent=2, sort_keys=True)
            handle.write("\n")
        replace_directory(written, output)  # an existing export stays whole until the new one is in place
    except OSError as error:  # a full disk, a quota: nothing of this export is left
        raise write_failed("CTranslate2 export", output, error, os.path.exists(output)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def spec_converter(ctranslate2, spec):
    """A ``ctranslate2.converters.Converter`` whose model is ``spec``: its ``convert`` validates, quantizes, saves."""

    class SpecConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    return SpecConverter()


def sentencepiece_pieces(path: str) -> list[str]:
    """The pieces of the SentencePiece model at ``path``, by id."""
    processor = spm.SentencePieceProcessor(model_file=path)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def vocabulary_tokens(pieces: list[str], rows: int) -> list[str]:
    """CTranslate2's vocabulary for an embedding of ``rows`` rows: the first ``rows`` of ``pieces`` by id.

    An embedding may have more rows than the SentencePiece model has pieces
    (``vocab_size`` asked more than the corpus gave): no id reaches those rows,
    which get names no piece has. A model may have more pieces than the
    embedding has rows (an imported vocabulary keeps pieces its id map lacks):
    our tokenizer reads those as UNK, and CTranslate2 reads a token missing from
    its vocabulary as UNK too.
    """
    return pieces[:rows] + [f"<unused_{i}>" for i in range(len(pieces), rows)]


def transformer_spec(ctranslate2, model, source_tokens: list[str], target_tokens: list[str]):
    """A filled ``ctranslate2.specs.TransformerSpec`` of ``model`` (a :class:`~tf_transformer.model.Transformer`).

    ``source_tokens`` and ``target_tokens`` name the ids of the source and target
    embeddings (their lengths are the embeddings' row counts).
    """
    check_supported(model)
    specs = ctranslate2.specs
    config = model.config
    layers = dict(
        num_heads=config.num_heads,
        pre_norm=config.pre_norm,
        activation=getattr(specs.Activation, ACTIVATIONS[config.activation]),
        head_dim=None if config.head_key_dim * config.num_heads == config.d_model else config.head_key_dim,
    )
    encoder = specs.TransformerEncoderSpec(num_layers=len(model.encoder.encoder_layers), **layers)
    decoder = specs.TransformerDecoderSpec(num_layers=len(model.decoder.decoder_layers), **layers)
    spec = specs.TransformerSpec(encoder, decoder)

    fill_stack(encoder, model.encoder, model.source_embedding, model.encoder.encoder_layers, model)
    fill_stack(decoder, model.decoder, model.target_embedding, model.decoder.decoder_layers, model)
    decoder.start_from_zero_embedding = BOS_ID in getattr(model.target_embedding, "zero_ids", ())
    # The pre-softmax projection is the target embedding (section 3.4), with the logits bias if the model has one.
    decoder.projection.weight = decoder.embeddings.weight
    bias = getattr(model.target_embedding, "logits_bias", None)
    if bias is not None:
        decoder.projection.bias = as_array(bias)

    spec.config.layer_norm_epsilon = float(config.layer_norm_epsilon)
    spec.config.unk_token = target_tokens[UNK_ID]
    spec.config.bos_token = target_tokens[BOS_ID]
    spec.config.eos_token = target_tokens[EOS_ID]
    spec.config.decoder_start_token = target_tokens[BOS_ID]
    spec.config.add_source_eos = True  # our sources end in EOS (pipelines.token_cache, Translator.encode_strings)
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    return spec


def check_supported(model) -> None:
    """Raises ``ValueError`` naming what of ``model`` CTranslate2's Transformer cannot run."""
    config = model.config
    if config.activation not in ACTIVATIONS:
        raise ValueError(
            f"The FFN activation {config.activation!r} has no CTranslate2 counterpart here "
            f"({', '.join(ACTIVATIONS)} have)"
        )
    if config.head_key_dim != config.head_value_dim:
        raise ValueError(
            f"CTranslate2 needs equal query/key and value head widths; this model has key_dim {config.head_key_dim} "
            f"and value_dim {config.head_value_dim}"
        )


def fill_stack(spec, stack, embedding, stack_layers, model) -> None:
    """One encoder or decoder ``spec`` from our ``stack``, its ``embedding`` and its layers."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = as_array(embedding.embeddings)  # [vocab, d_model]
    spec.scale_embeddings = bool(getattr(embedding, "scale", True))
    spec.position_encodings.encodings = position_table(stack, model)  # [positions, d_model]
    if stack.final_norm is not None:  # pre-norm's LayerNorm after the last layer
        fill_norm(spec.layer_norm, stack.final_norm)
    for layer_spec, layer in zip(spec.layer, stack_layers, strict=True):
        fill_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_residual, fused=True)
        cross = getattr(layer, "cross_attention", None)
        if cross is not None:
            fill_attention(layer_spec.attention, cross, layer.cross_attention_residual, fused=False)
        fill_linear(layer_spec.ffn.linear_0, layer.feed_forward.inner)  # W1, b1
        fill_linear(layer_spec.ffn.linear_1, layer.feed_forward.outer)  # W2, b2
        fill_norm(layer_spec.ffn.layer_norm, layer.feed_forward_residual.norm)


def position_table(stack, model) -> np.ndarray:
    """What ``stack``'s position layer adds at positions 0, 1, …: ``float32[rows, d_model]``.

    All ``max_positions`` rows of learned positions; for sinusoids at least
    :data:`SINUSOID_ROWS`, computed by the layer itself, whatever its layout.
    """
    config = model.config
    rows = config.max_positions if config.position == "learned" else max(config.max_positions, SINUSOID_ROWS)
    return as_array(stack.position_layer(np.zeros((1, rows, config.d_model), np.float32)))


def fill_attention(spec, attention, residual, fused: bool) -> None:
    """A ``MultiHeadAttentionSpec`` from our attention and the LayerNorm of its residual.

    CTranslate2 fuses the projections: self-attention has one ``[Q; K; V]`` linear,
    encoder-decoder attention a query linear and one ``[K; V]`` linear (the keys and
    values of the memory); the last linear is W^O.
    """
    query, key, value = (
        transposed(layer) for layer in (attention.query_dense, attention.key_dense, attention.value_dense)
    )
    if fused:
        set_linear(spec.linear[0], *concatenated([query, key, value]))
    else:
        set_linear(spec.linear[0], *query)
        set_linear(spec.linear[1], *concatenated([key, value]))
    fill_linear(spec.linear[-1], attention.output_dense)
    fill_norm(spec.layer_norm, residual.norm)


def transposed(dense) -> tuple[np.ndarray, np.ndarray | None]:
    """A Keras ``Dense``'s ``(weight [out, in], bias [out] or None)``: CTranslate2 keeps weights as ``[out, in]``."""
    bias = getattr(dense, "bias", None)
    return as_array(dense.kernel).T, None if bias is None else as_array(bias)


def concatenated(linears) -> tuple[np.ndarray, np.ndarray | None]:
    weights, biases = zip(*linears, strict=True)
    bias = None if biases[0] is None else np.concatenate(biases)
    return np.concatenate(weights), bias


def set_linear(spec, weight: np.ndarray, bias: np.ndarray | None) -> None:
    spec.weight = np.ascontiguousarray(weight)
    if bias is not None:
        spec.bias = bias


def fill_linear(spec, dense) -> None:
    set_linear(spec, *transposed(dense))


def fill_norm(spec, norm) -> None:
    spec.gamma = as_array(norm.gamma)
    spec.beta = as_array(norm.beta)


def as_array(value) -> np.ndarray:
    """A weight or tensor as a float32 NumPy array (weights of a mixed-precision model included)."""
    return np.asarray(value, dtype=np.float32)

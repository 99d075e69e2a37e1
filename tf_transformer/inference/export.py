"""Export a trained run as a SavedModel for TF Serving: strings in, translations out.

Layout: ``saved_models/<name>/<version>/`` (TF Serving's). Written with
``keras.export.ExportArchive``, which the session-based loader that TF Serving's
C++ server uses accepts (a plain ``tf.saved_model.save`` around a Keras 3 model
does not: keras-team/keras#19274). The graph holds only stock TensorFlow and
tensorflow-text ops; loaders must ``import tensorflow_text`` first.

Signatures:
  ``serving_default``: ``inputs: string[batch]`` → ``translations: string[batch]``,
    ``scores: float32[batch]`` (length-normalized log-probabilities).
  ``translate_ids``: ``inputs: int32[batch, len]`` (EOS-terminated, 0-padded)
    → ``ids: int32[batch, out_len]``, ``scores: float32[batch]``.
The SentencePiece model is embedded in the graph's tokenizer ops and also
shipped as ``assets/sp.model`` for clients that tokenize themselves.

An ``ids_only`` export has ``translate_ids`` alone, also as ``serving_default``:
its graph holds no tensorflow-text op, so TF Serving builds without TF Text
load it, and clients tokenize with ``assets/sp.model``.

``assets.extra/tf_transformer.json`` (:data:`EXPORT_INFO`) records what a server
checks before running a request (the longest source, the vocabulary size) and
the decoding settings fixed in the graph; TF Serving ignores the file.
"""

from __future__ import annotations

import json
import os
import shutil

import keras
import tensorflow as tf

from pipelines.vocab import Tokenizer
from tf_transformer.atomic import replace_directory, staging_directory
from tf_transformer.inference.precision import inference_copy
from tf_transformer.inference.translator import Translator
from tf_transformer.run_dir import load_run, restore_model, vocabulary_path, write_failed

EXPORT_INFO = os.path.join("assets.extra", "tf_transformer.json")

# The axes after the first that a batch pads to its longest sentence, for each signature output that has any:
# "output" to the longest decode a sentence of the batch may run (its source length + ``extra_length``, bounded as
# ``Translator.search`` bounds it: longer than its hypothesis when that ends early), "source" to the longest source
# (tokens with EOS). A server that merges requests into one batch cuts each request's share back along these axes
# to what a call with that request alone returns.
PADDED_AXES = {"ids": ("output",), "attention": ("output", "source")}


def read_export_info(export_path: str) -> dict:
    """The export's :data:`EXPORT_INFO`, or ``{}`` for exports written before it existed."""
    path = os.path.join(export_path, EXPORT_INFO)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


class SourceLimit:
    """An export's maximum source length, checked in Python before a sentence reaches its graph.

    The graph refuses a whole batch for one sentence over the limit; a server or
    a batch tool checks each sentence first, so that it can say which one it was
    and fail only that one. Counts tokens as the graph does: the stripped
    sentence's pieces, plus EOS. ``limit`` is ``None`` for exports that record
    none (written before the limit existed) or that truncate.
    """

    def __init__(self, export_path: str):
        import sentencepiece as spm

        info = read_export_info(export_path)
        vocabulary = os.path.join(export_path, "assets", "sp.model")
        self.pieces = spm.SentencePieceProcessor(model_file=vocabulary) if os.path.exists(vocabulary) else None
        self.limit = None if info.get("truncate_source") or self.pieces is None else info.get("max_source_length")
        self.vocab_size = info.get("source_vocab_size") or (self.pieces.get_piece_size() if self.pieces else None)

    def tokens(self, text: str) -> int:
        """Source tokens of ``text`` with EOS, as the graph counts them (``tf.strings.strip`` strips ASCII)."""
        return len(self.pieces.encode(text.strip(" \t\n\v\f\r"))) + 1

    def violation(self, text: str) -> str | None:
        """Why ``text`` is refused, or ``None``."""
        if self.limit is None:
            return None
        tokens = self.tokens(text)
        if tokens <= self.limit:
            return None
        return (
            f"{tokens} tokens (EOS included) is longer than this model's maximum source length of {self.limit}; "
            "shorten or split the sentence, or export with a larger --max_source_length or --truncate_source"
        )


def graph_error(error: BaseException) -> str:
    """The reason in an error the exported graph raised (TensorFlow puts it after a generic first line)."""
    text = str(error)
    for marker in ("A source sentence is longer", "Token ids must"):
        if marker in text:  # the assertion's message, up to the data TensorFlow appends in brackets
            return (marker + text.split(marker, 1)[1].splitlines()[0].split("]")[0]).replace("\\'", "'")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def export_info(translator: Translator, ids_only: bool, alignment_layer: int | None = None) -> dict:
    """What :data:`EXPORT_INFO` holds for ``translator``."""
    model = translator.model
    return {
        "signatures": ["serving_default", "translate_ids"]
        + (["translate_with_alignment"] if alignment_layer is not None else []),
        "alignment_layer": alignment_layer,
        "serving_default": "translate_ids" if ids_only else "translate",
        "max_source_length": translator.max_source_length,
        "truncate_source": translator.truncate_source,
        "source_vocab_size": model.src_vocab_size or model.vocab_size,
        "beam_size": translator.beam_size,
        "alpha": translator.alpha,
        "extra_length": translator.extra_length,
        "min_length": translator.min_length,
        "max_length": translator.max_length,
        "streams": translator.streams,
        "dtype": model.dtype_policy.name,
    }


def export_translator(
    translator: Translator,
    vocabulary_path: str,
    output: str,
    overwrite: bool = False,
    ids_only: bool = False,
    alignment_layer: int | None = None,
) -> str:
    """Writes ``translator`` as a SavedModel at ``output``, atomically (:mod:`tf_transformer.atomic`).

    ``ids_only``: no string signature and no tensorflow-text op (see the module).
    ``alignment_layer``: add ``translate_with_alignment``, aligning with that
    decoder layer's attention (:meth:`Translator.translate_with_alignment`).

    What is exported is a frozen copy (``Translator.frozen``): the decoder's
    kernels are saved in the layout decoding multiplies with, so a request does
    not lay them out again.
    """
    output = os.path.abspath(output)
    if os.path.exists(output) and not overwrite:
        raise FileExistsError(f"{output} exists: export to a new version directory (or pass overwrite)")
    if translator.frozen_weights is None:
        translator = translator.frozen()
    staging = staging_directory(output)
    try:
        archive = keras.export.ExportArchive()
        # The variables the endpoints use are saved without asking; tracking the
        # Keras model too would save every weight a second time (as its Keras
        # variable and as the TensorFlow variable the graph captures), and its
        # decoder kernels a third, next to their frozen decoding layout.
        ids_spec = tf.TensorSpec([None, None], tf.int32, name="inputs")
        if ids_only:
            archive.add_endpoint(
                "serving_default", lambda inputs: translator.translate_ids(inputs), input_signature=[ids_spec]
            )
        else:
            archive.track(translator.tokenizer)
            archive.add_endpoint(
                "serving_default",
                lambda inputs: translator.translate(inputs),
                input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
            )
            if alignment_layer is not None:
                archive.add_endpoint(
                    "translate_with_alignment",
                    lambda inputs: translator.translate_with_alignment(inputs, alignment_layer),
                    input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
                )
        archive.add_endpoint(
            "translate_ids", lambda inputs: translator.translate_ids(inputs), input_signature=[ids_spec]
        )
        target = os.path.join(staging, "model")
        archive.write_out(target, verbose=False)
        # The graph embeds the SentencePiece model in its ops; the file goes with
        # the export too, for clients that tokenize themselves.
        os.makedirs(os.path.join(target, "assets"), exist_ok=True)
        shutil.copyfile(vocabulary_path, os.path.join(target, "assets", "sp.model"))
        os.makedirs(os.path.join(target, "assets.extra"), exist_ok=True)
        with open(os.path.join(target, EXPORT_INFO), "w", encoding="utf-8") as handle:
            json.dump(export_info(translator, ids_only, None if ids_only else alignment_layer), handle, indent=2)
        replace_directory(target, output)  # an existing export stays whole until the new one is in place
    except (tf.errors.OpError, OSError) as error:  # a full disk, a quota: nothing of this export is left
        raise write_failed("export", output, error, os.path.exists(output)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def export_run(
    model_dir: str,
    output: str,
    checkpoint: str | None = None,
    beam_size: int | None = None,
    alpha: float | None = None,
    extra_length: int | None = None,
    overwrite: bool = False,
    min_length: int = 0,
    max_length: int | None = None,
    dtype: str | None = None,
    streams: int = 1,
    max_source_length: int | None = None,
    truncate_source: bool = False,
    ids_only: bool = False,
    alignment_layer: int | str | None = "last",
) -> str:
    """Exports the run in ``model_dir`` (its averaged or newest checkpoint) to ``output``.

    The decoding settings (beam, α, length limits, ``streams`` of
    :class:`~tf_transformer.inference.translator.Translator`) are fixed in the exported graph.
    ``max_source_length`` defaults to the longest sentence training kept (its
    ``max_length``), the longest the model has learned to translate.
    ``alignment_layer``: the decoder layer (from 0) whose attention aligns in the
    ``translate_with_alignment`` signature; ``"last"`` (the default: it aligned
    best of every layer measured here, docs/attention.md) or ``"penultimate"``
    (what Garg et al. 2019 found best in 6-layer models); ``None`` for no such signature.
    ``dtype`` (e.g. ``"bfloat16"``) stores and computes the weights in that dtype
    (:func:`~tf_transformer.inference.precision.inference_copy`); by default float32.
    """
    model, config = restore_model(model_dir, checkpoint)
    if max_source_length is None:
        max_source_length = training_max_length(model_dir)
    longest = max_source_length + (config.extra_decode_length if extra_length is None else extra_length)
    if config.position == "learned" and longest > config.max_length:
        raise ValueError(
            f"max_source_length {max_source_length} lets outputs reach {longest} tokens, past the "
            f"{config.max_length} positions the model learned; lower --max_source_length or --extra_length"
        )
    if dtype is not None and dtype != model.dtype_policy.name:
        model = inference_copy(model, dtype)
    vocabulary = vocabulary_path(model_dir)
    translator = Translator(
        model,
        Tokenizer(vocabulary),
        beam_size=beam_size or config.beam_size,
        alpha=config.length_penalty if alpha is None else alpha,
        extra_length=config.extra_decode_length if extra_length is None else extra_length,
        min_length=min_length,
        max_length=max_length,
        streams=streams,
        max_source_length=max_source_length,
        truncate_source=truncate_source,
    )
    if alignment_layer in ("last", "penultimate"):
        alignment_layer = max(config.num_layers - (1 if alignment_layer == "last" else 2), 0)
    if alignment_layer is not None and not 0 <= alignment_layer < config.num_layers:
        raise ValueError(f"alignment_layer {alignment_layer}: the decoder has layers 0 to {config.num_layers - 1}")
    return export_translator(
        translator, vocabulary, output, overwrite=overwrite, ids_only=ids_only, alignment_layer=alignment_layer
    )


def training_max_length(model_dir: str) -> int:
    """The longest sentence (subwords with EOS, per side) that training in ``model_dir`` kept."""
    config, options = load_run(model_dir)
    return options.get("max_length") or config.max_sequence_length

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
"""

from __future__ import annotations

import os
import shutil

import keras
import tensorflow as tf

from pipelines.vocab import Tokenizer
from tf_transformer.atomic import replace_directory, staging_directory
from tf_transformer.inference.precision import inference_copy
from tf_transformer.inference.translator import Translator
from tf_transformer.run_dir import restore_model, vocabulary_path, write_failed


def export_translator(translator: Translator, vocabulary_path: str, output: str, overwrite: bool = False) -> str:
    """Writes ``translator`` as a SavedModel at ``output``, atomically (:mod:`tf_transformer.atomic`).

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
        archive.track(translator.tokenizer)
        archive.add_endpoint(
            "serving_default",
            lambda inputs: translator.translate(inputs),
            input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
        )
        archive.add_endpoint(
            "translate_ids",
            lambda inputs: translator.translate_ids(inputs),
            input_signature=[tf.TensorSpec([None, None], tf.int32, name="inputs")],
        )
        target = os.path.join(staging, "model")
        archive.write_out(target, verbose=False)
        # The graph embeds the SentencePiece model in its ops; the file goes with
        # the export too, for clients that tokenize themselves.
        os.makedirs(os.path.join(target, "assets"), exist_ok=True)
        shutil.copyfile(vocabulary_path, os.path.join(target, "assets", "sp.model"))
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
) -> str:
    """Exports the run in ``model_dir`` (its averaged or newest checkpoint) to ``output``.

    The decoding settings (beam, α, length limits, ``streams`` of
    :class:`~tf_transformer.inference.translator.Translator`) are fixed in the exported graph.
    ``dtype`` (e.g. ``"bfloat16"``) stores and computes the weights in that dtype
    (:func:`~tf_transformer.inference.precision.inference_copy`); by default float32.
    """
    model, config = restore_model(model_dir, checkpoint)
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
    )
    return export_translator(translator, vocabulary, output, overwrite=overwrite)

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
  ``translate_with_options``, ``score``, ``sample``: settings per request
    (:func:`request_time_endpoints`).
The SentencePiece model is embedded in the graph's tokenizer ops and also
shipped as ``assets/sp.model`` for clients that tokenize themselves.

An ``ids_only`` export has ``translate_ids`` alone, also as ``serving_default``:
its graph holds no tensorflow-text op, so TF Serving builds without TF Text
load it, and clients tokenize with ``assets/sp.model``.

``assets.extra/tf_transformer.json`` records what a server checks before running a
request (the longest source, the vocabulary size) and the decoding settings fixed in
the graph (:class:`~tf_transformer.decoding.decode_options.DecodeOptions`); TF
Serving ignores the file, and :mod:`tf_transformer.exporting.export_info` reads it.
``assets.extra/tf_serving_warmup_requests`` holds requests that TF Serving and
``tft-serve`` run before serving the export, so that no client pays for a
signature's first call (:mod:`tf_transformer.exporting.warmup_requests`).
"""

from __future__ import annotations

import os
import shutil

import keras
import tensorflow as tf

from configs.decoding import SAMPLING_SETTINGS, SEARCH_SETTINGS, SETTINGS
from pipelines import target_model_beside
from tf_transformer.cpu import choose_cpu_precision
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.precision import inference_copy
from tf_transformer.decoding.request import DecodeRequest
from tf_transformer.exporting.export_info import (
    REQUEST_TIME_SIGNATURES,
    TOKENS_SIGNATURE,
    ExportInfo,
    write_export_info,
)
from tf_transformer.exporting.warmup_requests import warmup_requests, write_warmup_requests
from tf_transformer.files import replace_directory, staging_directory, write_failed
from tf_transformer.inference.translator import Translator
from tf_transformer.run_dir import load_run, restore_model, vocabulary_path
from tf_transformer.tasks import Task, run_tokenizer, task_of_run


def export_info(
    translator: Translator,
    ids_only: bool,
    alignment_layer: int | None = None,
    task: Task | None = None,
    request_signatures: bool = False,
    precision_reason: str | None = None,
) -> ExportInfo:
    """What :data:`~tf_transformer.exporting.export_info.EXPORT_INFO` records for ``translator``."""
    model = translator.model
    return ExportInfo(
        signatures=("serving_default", "translate_ids")
        + (REQUEST_TIME_SIGNATURES if request_signatures and not ids_only else ())
        + (("translate_with_alignment",) if alignment_layer is not None else ())
        + ((TOKENS_SIGNATURE,) if translator.options.word_tokenizer and not ids_only else ()),
        serving_default="translate_ids" if ids_only else "translate",
        alignment_layer=alignment_layer,
        source_vocab_size=model.config.encoder_vocab_size,
        dtype=model.dtype_policy.name,
        precision_reason=precision_reason,
        task=task.name if task else None,
        linearization=getattr(task, "linearization", None),
        closings=getattr(task, "closings", None),
        options=translator.options,
    )


def request_time_endpoints(translator: Translator) -> dict:
    """The signatures that take their settings per request: ``name → (function, input_signature)``.

    ``translate_with_options`` (:meth:`Translator.translate_with_options`: the
    beam search's settings and target prefixes), ``score`` (:meth:`Translator.score`)
    and ``sample`` (:meth:`Translator.sample`). Each setting is a scalar input of
    its :data:`configs.decoding.SETTINGS` dtype, which makes these signatures callable
    only in TF Serving's columnar request format (docs/inference.md#request-time-options).
    """
    strings = lambda name: tf.TensorSpec([None], tf.string, name=name)  # noqa: E731
    scalars = lambda names: [tf.TensorSpec([], SETTINGS[name].dtype, name=name) for name in names]  # noqa: E731

    def translate_with_options(inputs, target_prefix, *settings):
        request = DecodeRequest.from_settings(dict(zip(SEARCH_SETTINGS, settings, strict=True)))
        return translator.translate_with_options(inputs, target_prefix, request)

    def score(inputs, targets):
        return translator.score(inputs, targets)

    def sample(inputs, *settings):
        return translator.sample(
            inputs, DecodeRequest.from_settings(dict(zip(SAMPLING_SETTINGS, settings, strict=True)))
        )

    return {
        "translate_with_options": (
            translate_with_options,
            [strings("inputs"), strings("target_prefix"), *scalars(SEARCH_SETTINGS)],
        ),
        "score": (score, [strings("inputs"), strings("targets")]),
        "sample": (sample, [strings("inputs"), *scalars(SAMPLING_SETTINGS)]),
    }


def export_translator(
    translator: Translator,
    vocabulary_path: str,
    output: str,
    overwrite: bool = False,
    ids_only: bool = False,
    alignment_layer: int | None = None,
    task: Task | None = None,
    request_signatures: bool = True,
    precision_reason: str | None = None,
    warmup: bool = True,
) -> str:
    """Writes ``translator`` as a SavedModel at ``output``, atomically (:mod:`tf_transformer.files`).

    ``ids_only``: no string signature and no tensorflow-text op (see the module).
    ``alignment_layer``: add ``translate_with_alignment``, aligning with that
    decoder layer's attention (:meth:`Translator.translate_with_alignment`).
    ``request_signatures``: add :func:`request_time_endpoints` (not with ``ids_only``).
    ``precision_reason``: why the model computes in its dtype, recorded with it.
    ``warmup``: write TF Serving's warmup requests (:mod:`tf_transformer.exporting.warmup_requests`).

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
            for name, (function, spec) in (request_time_endpoints(translator) if request_signatures else {}).items():
                archive.add_endpoint(name, function, input_signature=spec)
            if translator.options.word_tokenizer is not None:  # the words split already (a parser's gold words)
                given = translator.with_options(word_tokenizer=None)
                archive.add_endpoint(
                    TOKENS_SIGNATURE,
                    lambda inputs: given.translate(inputs),
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
        if os.path.exists(target_model_beside(vocabulary_path)):  # an imported model's target side
            shutil.copyfile(target_model_beside(vocabulary_path), os.path.join(target, "assets", "sp.target.model"))
        alignment = None if ids_only else alignment_layer
        info = export_info(translator, ids_only, alignment, task, request_signatures, precision_reason)
        write_export_info(target, info)
        if warmup:  # built from the export as written: its signatures, its limits, its vocabulary
            write_warmup_requests(target, warmup_requests(target))
        replace_directory(target, output)  # an existing export stays whole until the new one is in place
    except (tf.errors.OpError, OSError) as error:  # a full disk, a quota: nothing of this export is left
        raise write_failed("export", output, error, os.path.exists(output)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def export_run(
    model_dir: str,
    output: str,
    options: DecodeOptions | None = None,
    checkpoint: str | None = None,
    overwrite: bool = False,
    dtype: str | None = None,
    ids_only: bool = False,
    alignment_layer: int | str | None = "last",
    request_signatures: bool = True,
    warmup: bool = True,
) -> str:
    """Exports the run in ``model_dir`` (its averaged or newest checkpoint) to ``output``.

    ``options`` are fixed in the exported graph; by default the run's
    (:meth:`DecodeOptions.from_config`). Without a ``max_source_length`` the export
    takes the longest sentence training kept (its ``max_train_length``), the
    longest the model has learned to translate.
    ``alignment_layer``: the decoder layer (from 0) whose attention aligns in the
    ``translate_with_alignment`` signature; ``"last"`` (the default: it aligned
    best of every layer measured here, docs/attention.md) or ``"penultimate"``
    (what Garg et al. 2019 found best in 6-layer models); ``None`` for no such signature.
    ``request_signatures``, ``warmup``: see :func:`export_translator`.
    ``dtype`` (e.g. ``"bfloat16"``) stores and computes the weights in that dtype
    (:func:`~tf_transformer.decoding.precision.inference_copy`); by default float32;
    ``"auto"``: bfloat16 where this machine's CPU has a bfloat16 unit, else float32,
    as training's ``--precision auto`` chooses on CPUs (the export records which and why).
    """
    reason = None if dtype is None else "given"
    if dtype == "auto":
        dtype, reason = choose_cpu_precision("bfloat16")
        reason = f"auto: {reason}"
    model, config = restore_model(model_dir, checkpoint)
    options = options or DecodeOptions.for_run(model_dir, word_tokenizer=task_of_run(model_dir).word_tokenizer)
    if options.max_source_length is None:
        options = options.replace(max_source_length=training_max_length(model_dir))
    longest = options.max_source_length + options.max_extra_length
    if config.position == "learned" and longest > config.max_positions:
        raise ValueError(
            f"max_source_length {options.max_source_length} lets outputs reach {longest} tokens, past the "
            f"{config.max_positions} positions the model learned; lower --max_source_length or --max_extra_length"
        )
    if dtype is not None and dtype != model.dtype_policy.name:
        model = inference_copy(model, dtype)
    vocabulary = vocabulary_path(model_dir)
    translator = Translator(model, run_tokenizer(model_dir), options)
    depth = len(model.decoder.decoder_layers)
    if alignment_layer in ("last", "penultimate"):
        alignment_layer = max(depth - (1 if alignment_layer == "last" else 2), 0)
    if alignment_layer is not None and not 0 <= alignment_layer < depth:
        raise ValueError(f"alignment_layer {alignment_layer}: the decoder has layers 0 to {depth - 1}")
    return export_translator(
        translator,
        vocabulary,
        output,
        overwrite=overwrite,
        ids_only=ids_only,
        alignment_layer=alignment_layer,
        task=task_of_run(model_dir),
        request_signatures=request_signatures,
        precision_reason=reason,
        warmup=warmup,
    )


def training_max_length(model_dir: str) -> int:
    """The longest sentence (subwords with EOS, per side) that training in ``model_dir`` kept."""
    return load_run(model_dir)[0].max_train_length

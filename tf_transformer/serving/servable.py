"""One loaded version of an export: its signatures, its limits, and a request's checks against them."""

from __future__ import annotations

import os

import numpy as np

from tf_transformer.constants import EOS_ID, PAD_ID
from tf_transformer.decoding.request import DecodeRequest, RequestError
from tf_transformer.exporting.export_info import (
    PADDED_AXES,
    REQUEST_TIME_SIGNATURES,
    SPLIT_SIGNATURES,
    SourceLimit,
    read_export_info,
)
from tf_transformer.serving.rest_api import ClientError, PredictRequest
from tf_transformer.tasks import get_task


class Servable:
    """The SavedModel at ``path``, served as ``version``.

    The limits an export records (:class:`~tf_transformer.exporting.export_info.SourceLimit`:
    the longest source, the vocabulary size) are checked here per request, so
    that a request that would fail inside the graph, or take the server's
    memory, fails alone before it is merged with others into a batch. An export
    of another format (:data:`~tf_transformer.exporting.export_info.EXPORT_FORMAT`)
    is refused before its graph is loaded: the version fails to load, with why.

    A merged batch pads some outputs to its longest sentence; :meth:`fit` cuts a
    request's share back to what a call with that request alone returns, so an
    answer does not depend on the requests that shared its batch.

    A parser's answers (an export whose task is parsing) hold, besides the
    graph's ``translations`` (linearized trees, what TF Serving returns),
    ``trees``: each repaired into a tree over its input's words (:meth:`postprocess`,
    in :meth:`run`).
    """

    def __init__(self, path: str, version: int):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

        self.path = path
        self.version = version
        self.info = read_export_info(path)  # first: an export of another format is refused without loading it
        self._tf = tf
        self.loaded = tf.saved_model.load(path)
        self.signatures = dict(self.loaded.signatures)
        self.input_kinds = {name: _input_kinds(function) for name, function in self.signatures.items()}
        self.limits = SourceLimit(path)
        self.token_limits = SourceLimit(path, tokenized=True)  # SPLIT_SIGNATURES': the words split already
        self.task = get_task(self.info.task, self.info.linearization, self.info.closings)
        self._metadata = _signature_defs(path)

    def warm_up(self) -> tuple[int, float]:
        """Replays the export's warmup requests (:mod:`tf_transformer.serving.warmup`), as TF Serving does
        before a version serves: ``(requests, seconds)``, ``(0, 0.0)`` without the file. Raises
        :class:`~tf_transformer.serving.warmup.WarmupError`, naming the file and the record, where TF
        Serving would fail the load."""
        from tf_transformer.serving.warmup import replay_warmup

        return replay_warmup(self.path, self.signatures)

    def check(self, request: PredictRequest) -> None:
        """Refuses (:class:`ClientError`) a source over the export's length limit, an id outside its vocabulary,
        or a decoding setting out of range (:meth:`~tf_transformer.decoding.request.DecodeRequest.check`
        against the options the export records, as its graph would).

        An id row's length is its length as sent, padding ids included.
        """
        if request.signature in DECODING_SIGNATURES:
            try:
                DecodeRequest.from_settings(request.scalars).check(self.info.options)
            except RequestError as error:
                raise ClientError(str(error)) from None
        limit, vocab_size = self.limits.limit, self.limits.vocab_size
        if self.input_kinds[request.signature] != "ids":  # strings, alone or with other inputs
            limits = self.token_limits if request.signature in SPLIT_SIGNATURES else self.limits
            for index, text in enumerate(request.rows):
                if (why := limits.violation(text)) is not None:
                    raise ClientError(f"input {index}: {why}")
            return
        for index, row in enumerate(request.rows):
            # The row's length, padding included: rows are padded to the widest and the graph runs on all of it,
            # so padding not counted would let one row of a token and 400,000 zeros through.
            if limit is not None and len(row) > limit:
                raise ClientError(
                    f"input {index}: {len(row)} ids (padding {PAD_ID} and EOS {EOS_ID} included) is longer than "
                    f"this model's maximum source length of {limit}"
                )
            if vocab_size and not all(0 <= i < vocab_size for i in row):
                raise ClientError(f"input {index} holds a token id outside the vocabulary [0, {vocab_size})")

    def run(self, signature: str, rows: list, columns: dict | None = None, scalars: dict | None = None):
        """The signature's outputs (``dict[str, np.ndarray]``) for ``rows`` (strings, or id lists padded here to
        one width), with a request's other inputs (:class:`~tf_transformer.serving.rest_api.PredictRequest`)."""
        tf = self._tf
        kinds = self.input_kinds[signature]
        if kinds == "ids":
            width = max(len(row) for row in rows)
            inputs = {"inputs": tf.constant([row + [PAD_ID] * (width - len(row)) for row in rows], tf.int32)}
        else:
            inputs = {"inputs": tf.constant(rows, tf.string)}
        for key, column in (columns or {}).items():
            inputs[key] = tf.constant(column, tf.string)
        for key, value in (scalars or {}).items():
            inputs[key] = tf.constant(value, SCALAR_DTYPES[kinds[key]])
        outputs = self.signatures[signature](**inputs)
        return self.postprocess(signature, rows, {key: value.numpy() for key, value in outputs.items()})

    def postprocess(self, signature: str, rows: list, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``outputs`` plus, for a parser's string signatures, ``trees``: each output repaired over its words."""
        if not self.task.target_symbols or self.input_kinds[signature] == "ids" or "translations" not in outputs:
            return outputs

        options = self.info.options
        split = None if signature in SPLIT_SIGNATURES else options.word_tokenizer

        def tree(row: str, text: bytes) -> bytes:
            return self.task.postprocess(row, text.decode("utf-8"), split).encode("utf-8") if row.strip() else b""

        translations = outputs["translations"]  # [rows] or [rows, nbest]
        trees = [
            [tree(row, text) for text in texts] if translations.ndim == 2 else tree(row, texts)
            for row, texts in zip(rows, translations, strict=True)
        ]
        return {**outputs, "trees": np.array(trees, dtype=object)}

    def fit(self, signature: str, rows: list, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``rows``' share of a merged batch's ``outputs``, cut to the shapes :meth:`run` of ``rows`` alone gives.

        Cuts the axes :data:`~tf_transformer.exporting.export_info.PADDED_AXES` names. Where
        a length is not known (an export without ``assets/sp.model`` to count a source's
        tokens with), the axis loses only its trailing all-zero entries.
        """
        lengths = self._lone_lengths(signature, rows)
        fitted = {}
        for key, value in outputs.items():
            for axis, name in enumerate(PADDED_AXES.get(key, ()), start=1):
                if axis < value.ndim:
                    value = _cut(value, axis, lengths[name])
            fitted[key] = value
        return fitted

    def _lone_lengths(self, signature: str, rows: list) -> dict[str, int | None]:
        """The ``"source"`` and ``"output"`` lengths of :meth:`run` on ``rows`` alone (``None``: not known).

        As the graph sets them: sources padded to the longest (tokens with EOS, cut
        to the maximum source length when the export truncates, as
        ``Translator.limit_source`` does); outputs to the longest decode a row may
        run, as ``Translator.search`` bounds it (``DecodeOptions.longest_output``).
        """
        options = self.info.options
        cut = options.max_source_length if options.truncate_source else None
        if self.input_kinds[signature] == "strings":
            if self.limits.pieces is None:
                return {"source": None, "output": None}
            lengths = [self.limits.tokens(text) for text in rows]  # EOS included
            if cut is not None:
                lengths = [min(length, cut) for length in lengths]
            width = max(lengths)
        else:
            width = max(len(row) for row in rows)
            ids = np.array([row + [PAD_ID] * (width - len(row)) for row in rows])  # [rows, width], as run() pads
            lengths = (ids != PAD_ID).sum(axis=1)  # [rows]
            if cut is not None and width > cut:
                ids = ids[:, :cut]
                ids[lengths > cut, cut - 1] = EOS_ID
                width, lengths = cut, (ids != PAD_ID).sum(axis=1)
        return {"source": width, "output": int(max(options.longest_output(int(length)) for length in lengths))}

    def metadata(self) -> dict:
        """The signatures as TF Serving's model metadata API gives them (``GetModelMetadataResponse`` in JSON)."""
        return {
            "model_spec": {"signature_name": "", "version": str(self.version)},
            "metadata": {"signature_def": {"signature_def": self._metadata}},
        }


# The request-time signatures whose scalars are a decoding request (``score`` has none).
DECODING_SIGNATURES = tuple(name for name in REQUEST_TIME_SIGNATURES if name != "score")
SCALAR_DTYPES = {"int32": "int32", "int64": "int64", "float": "float32"}  # a scalar input's kind → its dtype


def _input_kinds(function) -> str | dict[str, str]:
    """What a signature takes: ``"strings"`` or ``"ids"`` when ``inputs`` is its only input, else each input's
    kind by name (:func:`~tf_transformer.serving.rest_api.parse_predict`)."""
    specs = function.structured_input_signature[1]
    if set(specs) == {"inputs"}:
        return "strings" if specs["inputs"].dtype.name == "string" else "ids"
    kinds = {}
    for name, spec in specs.items():
        if spec.shape.rank == 0:
            kinds[name] = "float" if spec.dtype.is_floating else spec.dtype.name
        else:
            kinds[name] = "strings"
    return kinds


def _cut(value: np.ndarray, axis: int, length: int | None) -> np.ndarray:
    """``value`` cut to ``length`` along ``axis``; ``None``: to its last entry that is not all zeros."""
    if length is None and value.size:
        used = np.flatnonzero(np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1).any(axis=1))
        length = used[-1] + 1 if used.size else 1
    return value[(slice(None),) * axis + (slice(0, length),)]


def _signature_defs(path: str) -> dict:
    """The SavedModel's SignatureDefs as JSON with TF Serving's field names, fields at their defaults included."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        model.ParseFromString(handle.read())
    signatures = model.meta_graphs[0].signature_def
    return {name: _message_dict(json_format, signature) for name, signature in signatures.items()}


def _message_dict(json_format, message) -> dict:
    """A proto as JSON with TF Serving's field names, fields at their defaults included."""
    try:
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except TypeError:  # protobuf before 5.26 names the option differently
        return json_format.MessageToDict(message, preserving_proto_field_name=True, including_default_value_fields=True)

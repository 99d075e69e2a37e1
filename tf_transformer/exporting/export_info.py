"""Reading an export without loading it: what it records, its limits, the axes its outputs pad.

A server checks each request against the limits an export records before any
graph runs, and cuts a merged batch's padded outputs back per request; it does
so with this module, which imports neither Keras nor the model (nor TensorFlow).
:mod:`tf_transformer.exporting.saved_model` writes what is read here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.formats import FORMAT_KEY, FormatError, check_format
from tf_transformer.language_codes import SourcePieces

EXPORT_INFO = os.path.join("assets.extra", "tf_transformer.json")
# The format of an export (its signatures and their inputs and outputs, the assets, what EXPORT_INFO records),
# recorded in EXPORT_INFO and checked by every reader (tf_transformer.formats). A change of format bumps this number.
EXPORT_FORMAT = 1

# The axes after the first that a batch pads to its longest sentence, for each signature output that has any:
# "output" to the longest decode a sentence of the batch may run (its source length + ``max_extra_length``, bounded
# as ``Translator.search`` bounds it: longer than its hypothesis when that ends early), "source" to the longest source
# (tokens with EOS). A server that merges requests into one batch cuts each request's share back along these axes
# to what a call with that request alone returns.
PADDED_AXES = {"ids": ("output",), "attention": ("output", "source")}

# The signatures whose settings come with each request (``exporting.saved_model.request_time_endpoints``): besides
# ``inputs`` they take more inputs, scalars among them, so a server runs each request alone.
REQUEST_TIME_SIGNATURES = ("translate_with_options", "score", "sample")
# An export whose options split raw text into words (``DecodeOptions.word_tokenizer``: a parser's) also
# takes text split already, in this signature: ``serving_default`` without the word tokenizer.
TOKENS_SIGNATURE = "translate_tokens"
# The signatures whose sources are words split already, whatever the export's word tokenizer (``score``'s are the
# words of the targets it scores).
SPLIT_SIGNATURES = (TOKENS_SIGNATURE, "score")

_OPTIONS = {field.name for field in dataclasses.fields(DecodeOptions)}


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """What ``assets.extra/tf_transformer.json`` (:data:`EXPORT_INFO`) of an export records.

    TF Serving ignores the file. It is one JSON object: :data:`EXPORT_FORMAT`
    under ``format``, the fields below but ``options``, and the
    :class:`DecodeOptions` fixed in the graph, each under its field name.

    Args:
      signatures: the export's signature names.
      serving_default: which function ``serving_default`` is (``"translate"`` or ``"translate_ids"``).
      alignment_layer: the decoder layer ``translate_with_alignment`` aligns with (``None``: no such signature).
      source_vocab_size: source token ids must be below this.
      dtype: the graph's weights and compute dtype policy.
      precision_reason: how ``dtype`` was chosen: ``"given"``, or ``tft-export --precision auto``'s reason
        (``None``: the default, float32).
      task: the run's task (``tf_transformer.tasks``; ``None``: translation).
        A parser's ``translations`` are linearized trees (docs/parsing.md), written as ``linearization`` and
        ``closings`` say.
      options: the decoding settings fixed in the graph.
    """

    signatures: tuple[str, ...] = ()
    serving_default: str | None = None
    alignment_layer: int | None = None
    source_vocab_size: int | None = None
    dtype: str | None = None
    precision_reason: str | None = None
    task: str | None = None
    linearization: str | None = None
    closings: str | None = None
    options: DecodeOptions = dataclasses.field(default_factory=DecodeOptions)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object the file holds."""
        fields = {
            field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "options"
        }
        return {FORMAT_KEY: EXPORT_FORMAT, **fields, "signatures": list(self.signatures), **self.options.to_dict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ExportInfo:
        """The info of the JSON object ``values`` (:meth:`to_dict`'s; its format is checked by
        :func:`read_export_info`)."""
        own = {field.name for field in dataclasses.fields(cls)} - {"options"}
        options = {key: value for key, value in values.items() if key in _OPTIONS}
        return cls(
            **{key: value for key, value in values.items() if key in own and key != "signatures"},
            signatures=tuple(values.get("signatures", ())),
            options=DecodeOptions(**options),
        )


def read_export_info(export_path: str) -> ExportInfo:
    """The export's :data:`EXPORT_INFO`, refused (:class:`~tf_transformer.formats.FormatError`) unless it
    records :data:`EXPORT_FORMAT`."""
    path = os.path.join(export_path, EXPORT_INFO)
    remedy = "export the run again with this version, or use the export with the version that wrote it"
    if not os.path.exists(path):
        raise FormatError(
            f"{path} not found: {export_path} is not an export of this tf_transformer, which reads export "
            f"format {EXPORT_FORMAT}; {remedy}"
        )
    with open(path, encoding="utf-8") as handle:
        values = json.load(handle)
    check_format(values, path, "export", EXPORT_FORMAT, remedy)
    return ExportInfo.from_dict(values)


def write_export_info(export_path: str, info: ExportInfo) -> None:
    """Writes ``info`` as the :data:`EXPORT_INFO` of the export at ``export_path``."""
    os.makedirs(os.path.join(export_path, os.path.dirname(EXPORT_INFO)), exist_ok=True)
    with open(os.path.join(export_path, EXPORT_INFO), "w", encoding="utf-8") as handle:
        json.dump(info.to_dict(), handle, indent=2)


class SourceLimit:
    """An export's maximum source length, checked in Python before a sentence reaches its graph.

    The graph refuses a whole batch for one sentence over the limit; a server or
    a batch tool checks each sentence first, so that it can say which one it was
    and fail only that one. Counts tokens as the graph does: the stripped
    sentence's pieces, plus EOS. ``limit`` is ``None`` for exports that
    truncate. ``tokenized``: the text goes to :data:`TOKENS_SIGNATURE` (split into
    words already).
    """

    def __init__(self, export_path: str, tokenized: bool = False):
        info = read_export_info(export_path)
        options = info.options
        vocabulary = os.path.join(export_path, "assets", "sp.model")
        self.pieces = SourcePieces.from_file(vocabulary) if os.path.exists(vocabulary) else None
        self.limit = None if options.truncate_source or self.pieces is None else options.max_source_length
        self.word_tokenizer = None if tokenized else options.word_tokenizer
        self.vocab_size = info.source_vocab_size or (self.pieces.processor.get_piece_size() if self.pieces else None)

    def tokens(self, text: str) -> int:
        """Source tokens of ``text`` with EOS, as the graph counts them (``tf.strings.strip`` strips ASCII; a
        leading language code is one piece: :mod:`tf_transformer.language_codes`; a parser's raw text is
        Penn-tokenized first)."""
        text = text.strip(" \t\n\v\f\r")
        if self.word_tokenizer == "penn":
            from tf_transformer.tasks.parsing.penn import penn_tokens

            text = penn_tokens(text)
        return len(self.pieces.encode(text)) + 1

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
    markers = ("A source sentence is longer", "Token ids must", "Decoding option", "Sampling option", "A target is")
    for marker in (*markers, "A prefix is"):
        if marker in text:  # the assertion's message, up to the data TensorFlow appends in brackets
            return (marker + text.split(marker, 1)[1].splitlines()[0].split("]")[0]).replace("\\'", "'")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__

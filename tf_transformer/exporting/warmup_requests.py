"""TF Serving's warmup file: requests a server runs on an export before it serves it.

TF Serving loads a version's graph, then replays the requests in
``assets.extra/tf_serving_warmup_requests`` before it reports the version
AVAILABLE: a TFRecord file of ``PredictionLog`` protos, at most
:data:`MAX_RECORDS`, each a ``predict_log.request`` naming its signature (TF
Serving's guide "SavedModel Warmup"; tensorflow/serving
``servables/tensorflow/saved_model_warmup_util.cc``). Without it, the first
request to each signature pays for what TensorFlow does on a function's first
call: instantiating and optimizing its graph, the beam search's loop and every
branch of it (each beam size, sampling's cuts, target prefixes) at once.
``tft-serve`` replays the same file (:mod:`tf_transformer.serving.warmup`).

:func:`warmup_requests` builds the requests from an export as written: its
SignatureDefs' inputs, what :data:`~tf_transformer.exporting.export_info.EXPORT_INFO`
records (the longest source, the decoding options) and its SentencePiece
model's pieces, decoded to words. Each signature gets one short sentence, at the
export's own settings: after it, a longer or larger request took no longer the first
time than the next (measured with the demo's export). ``serving_default`` also gets a
sentence as long as the export accepts and a batch of :data:`BATCH_SIZE`, for
what new shapes may cost elsewhere (memory, the kernels' set-up).
:func:`write_warmup_requests` writes them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import numpy as np
import sentencepiece as spm
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from configs.decoding import MODEL_SETTINGS, SETTINGS
from pipelines import target_model_beside
from tf_transformer.constants import EOS_ID, PAD_ID, UNK_ID
from tf_transformer.exporting.export_info import SPLIT_SIGNATURES, SourceLimit, read_export_info

WARMUP_REQUESTS = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_RECORDS = 1000  # TF Serving's WarmupConsts::kMaxNumRecords: a file with more fails the version's load

SHORT_TOKENS = 6  # the short sentence: five pieces and EOS
LONG_TOKENS = 128  # the long sentence of an export that accepts any length (no maximum source length)
BATCH_SIZE = 8

# A signature's inputs: name → (dtype, rank; None: unknown).
Inputs = dict[str, tuple[tf.dtypes.DType, int | None]]


def signature_inputs(export_path: str) -> dict[str, Inputs]:
    """Each signature's inputs as the export's ``saved_model.pb`` declares them (the loader's own left out)."""
    with open(os.path.join(export_path, "saved_model.pb"), "rb") as handle:
        model = saved_model_pb2.SavedModel.FromString(handle.read())
    return {
        name: {
            key: (
                tf.dtypes.as_dtype(info.dtype),
                None if info.tensor_shape.unknown_rank else len(info.tensor_shape.dim),
            )
            for key, info in signature.inputs.items()
        }
        for name, signature in model.meta_graphs[0].signature_def.items()
        if not name.startswith("__")  # __saved_model_init_op
    }


def warmup_requests(export_path: str) -> list[predict_pb2.PredictRequest]:
    """The requests that run every signature of the export at ``export_path`` (see the module), in file order.

    Raises ``ValueError`` naming the signature and input for an input it has no value for.
    """
    info = read_export_info(export_path)
    longest = info.options.max_source_length or LONG_TOKENS
    texts = _Texts(export_path, info.source_vocab_size)
    # The scalar settings (request-time signatures'): the export's own, the others' defaults.
    settings = {key: setting.default for key, setting in SETTINGS.items()}
    settings.update({key: getattr(info.options, key) for key in MODEL_SETTINGS})
    requests = []
    for name, inputs in sorted(signature_inputs(export_path).items()):
        for lengths in _plan(name, longest):
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = name
            values = texts.inputs(name, inputs, lengths, longest)
            for key, (dtype, rank) in sorted(inputs.items()):
                value = settings.get(key) if rank == 0 else values.get(key)
                if value is None:
                    raise ValueError(
                        f"no warmup value for input {key!r} of signature {name!r}: add one in {__name__}, "
                        "or export with --nowarmup"
                    )
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
            requests.append(request)
    if len(requests) > MAX_RECORDS:
        raise ValueError(f"{len(requests)} warmup requests: TF Serving reads at most {MAX_RECORDS}")
    return requests


def write_warmup_requests(export_path: str, requests: list[predict_pb2.PredictRequest]) -> str:
    """Writes ``requests`` as the export's :data:`WARMUP_REQUESTS` (one ``PredictionLog`` each); returns its path.

    Not atomic by itself: written into an export's staging directory, which is put in place whole.
    """
    path = os.path.join(export_path, WARMUP_REQUESTS)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for request in requests:
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def _plan(signature: str, longest: int) -> list[list[int]]:
    """A signature's requests: each one's sentence lengths, in tokens with EOS (see the module)."""
    short = min(SHORT_TOKENS, longest)
    if signature != "serving_default":
        return [[short]]
    # The batch's sentences spread from short to long: its rows end their searches at different steps.
    return [[short], [longest], [short + (longest - short) * row // (BATCH_SIZE - 1) for row in range(BATCH_SIZE)]]


class _Texts:
    """A request's text inputs: sources (as strings or ids), target prefixes and targets, of given lengths.

    Each sentence starts at another word of the vocabulary, so that no two are the same.
    """

    def __init__(self, export_path: str, vocab_size: int | None):
        self.sources = {split: _Sentences.of_source(export_path, split) for split in (False, True)}
        self.targets = _Sentences.of_target(export_path)
        self.vocab_size = vocab_size
        self.starts = itertools.count()

    def inputs(self, signature: str, inputs: Inputs, lengths: list[int], longest: int) -> dict:
        """``inputs``' values that are not scalars, for sentences of ``lengths`` tokens (EOS counted)."""
        starts = [next(self.starts) for _ in lengths]
        sources = self.sources[signature in SPLIT_SIGNATURES]
        texts = [sources.sentence(length, start) for length, start in zip(lengths, starts, strict=True)]
        values = {
            "targets": [self.targets.sentence(length, start) for length, start in zip(lengths, starts, strict=True)],
            "target_prefix": [""] * len(lengths),  # none: the search with a prefix is the same graph
        }
        if "inputs" in inputs:
            kind = inputs["inputs"][0]
            values["inputs"] = texts if kind == tf.string else self.ids(sources, texts, longest)
        return values

    def ids(self, sources: _Sentences, texts: list[str], longest: int) -> np.ndarray:
        """``int32[len(texts), width]``: each text's source ids, EOS-terminated and 0-padded, as clients send
        them (a piece the model has no id for as UNK)."""
        rows = []
        for text in texts:
            ids = sources.encode(text)[: longest - 1]
            rows.append([UNK_ID if self.vocab_size and i >= self.vocab_size else i for i in ids] + [EOS_ID])
        width = max(len(row) for row in rows)
        return np.array([row + [PAD_ID] * (width - len(row)) for row in rows], np.int32)


class _Sentences:
    """Sentences of a given length in tokens (EOS counted, as ``count`` counts), made of the whole-word pieces
    of a SentencePiece model: words that are one piece each, so that any length from 2 can be met exactly.

    ``encode``: a text's ids without EOS, as the graph's tokenizer gives them; ``vocab_size``: the ids the
    model takes (an imported vocabulary may hold more pieces).
    """

    def __init__(
        self,
        processor: spm.SentencePieceProcessor,
        count: Callable[[str], int],
        encode: Callable[[str], list[int]],
        vocab_size: int | None = None,
    ):
        self.count = count
        self.encode = encode
        size = min(processor.get_piece_size(), vocab_size or processor.get_piece_size())
        special = (processor.is_control, processor.is_unknown, processor.is_unused, processor.is_byte)
        self.words = [
            word
            for i in range(size)
            if not any(is_special(i) for is_special in special)
            and (piece := processor.id_to_piece(i)).startswith("\u2581")
            and (word := piece[1:]).isalpha()
            and count(word) == 2
        ]
        if not self.words:
            raise ValueError("the vocabulary has no whole-word piece to write warmup requests with: use --nowarmup")

    @classmethod
    def of_source(cls, export_path: str, split: bool) -> _Sentences:
        """Sources as the graph counts them (``split``: words split already, :data:`SPLIT_SIGNATURES`)."""
        limit = SourceLimit(export_path, tokenized=split)
        return cls(limit.pieces.processor, limit.tokens, limit.pieces.encode, limit.vocab_size)

    @classmethod
    def of_target(cls, export_path: str) -> _Sentences:
        """Targets (a prefix, a target to score), in the target side's own model where the export has one."""
        path = os.path.join(export_path, "assets", "sp.model")
        if os.path.exists(target_model_beside(path)):
            path = target_model_beside(path)
        processor = spm.SentencePieceProcessor(model_file=path)
        return cls(processor, lambda text: len(processor.encode(text.strip())) + 1, processor.encode)

    def sentence(self, tokens: int, start: int) -> str:
        """Words from the ``start``-th on (cycling), as many as fit in ``tokens``; at least one."""
        words = [self.words[(start + k) % len(self.words)] for k in range(max(tokens - 1, 1))]
        while len(words) > 1 and self.count(" ".join(words)) > tokens:  # a word of several pieces in context
            words.pop()
        return " ".join(words)

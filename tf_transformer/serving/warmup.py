"""An export's warmup requests, replayed before its version serves, as TF Serving replays them.

TF Serving runs the requests of ``assets.extra/tf_serving_warmup_requests``
(:mod:`tf_transformer.exporting.warmup_requests` writes them) once a version's
graph is loaded and before the version is AVAILABLE, so that no client pays for
a signature's first call. A file it cannot read, a record it cannot run or more
than 1,000 records fail the version's load; an export without the file loads
without warmup (tensorflow/serving ``servables/tensorflow/saved_model_warmup_util.cc``).
tft-serve does the same (:meth:`~tf_transformer.serving.servable.Servable.warm_up`).
Only ``predict_log`` records are replayed: an export has no classify, regress or
multi-inference signature for the other kinds.
"""

from __future__ import annotations

import os
import time

import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from tf_transformer.exporting.export_info import graph_error
from tf_transformer.exporting.warmup_requests import MAX_RECORDS, WARMUP_REQUESTS


class WarmupError(ValueError):
    """A warmup file that cannot be replayed whole: the version does not load. The message names the file and
    the record (from 0)."""


def read_warmup_requests(path: str) -> list[predict_pb2.PredictRequest]:
    """The requests of the warmup file at ``path``, each record checked before any runs (:class:`WarmupError`)."""
    requests = []
    records = iter(tf.data.TFRecordDataset(path).take(MAX_RECORDS + 1))
    while True:
        index = len(requests)
        try:
            record = next(records)
        except StopIteration:
            return requests
        except tf.errors.OpError as error:  # DataLossError: a truncated or corrupted file
            raise WarmupError(f"{path}: record {index} is not a TFRecord ({graph_error(error)})") from None
        if index == MAX_RECORDS:
            raise WarmupError(f"{path}: more than {MAX_RECORDS} records, TF Serving's most")
        try:
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        except DecodeError:
            raise WarmupError(f"{path}: record {index} is not a PredictionLog") from None
        kind = log.WhichOneof("log_type")
        if kind != "predict_log":
            what = f"a {kind}" if kind else "an empty PredictionLog"
            raise WarmupError(f"{path}: record {index} is {what}, not a predict_log")
        requests.append(log.predict_log.request)


def replay_warmup(export_path: str, signatures: dict) -> tuple[int, float]:
    """Runs each request of the export's warmup file through its signature in ``signatures`` (name →
    function, as loaded); ``(requests, seconds)``, ``(0, 0.0)`` for an export without the file.

    A request naming a signature the export lacks, or failing in the graph, is a :class:`WarmupError`.
    """
    path = os.path.join(export_path, WARMUP_REQUESTS)
    if not os.path.exists(path):
        return 0, 0.0
    started = time.monotonic()
    requests = read_warmup_requests(path)
    for index, request in enumerate(requests):
        name = request.model_spec.signature_name or "serving_default"  # TF Serving's default
        if name not in signatures:
            raise WarmupError(f"{path}: record {index} asks for signature {name!r}, which the export does not have")
        try:
            signatures[name](**{key: tf.constant(tf.make_ndarray(value)) for key, value in request.inputs.items()})
        except (tf.errors.OpError, TypeError, ValueError) as error:
            raise WarmupError(f"{path}: record {index} ({name}) failed: {graph_error(error)}") from None
    return len(requests), time.monotonic() - started

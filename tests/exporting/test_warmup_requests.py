"""The export's warmup file: TF Serving's protos read it; it runs every signature, a long sentence, a batch."""

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from tests.commands import export_cli
from tf_transformer.constants import PAD_ID
from tf_transformer.exporting.export_info import EXPORT_INFO, SPLIT_SIGNATURES, SourceLimit
from tf_transformer.exporting.warmup_requests import BATCH_SIZE, MAX_RECORDS, SHORT_TOKENS, WARMUP_REQUESTS


def prediction_logs(export) -> list:
    """The warmup file's records, read as TF Serving reads them: TFRecords of ``PredictionLog`` protos."""
    dataset = tf.data.TFRecordDataset(str(export / WARMUP_REQUESTS))
    return [prediction_log_pb2.PredictionLog.FromString(record.numpy()) for record in dataset]


def source_lengths(export, signature: str, inputs: np.ndarray) -> list[int]:
    """Each source's tokens with EOS, as the export's graph counts them (ids: those that are not padding)."""
    if inputs.dtype != object:
        return [int(n) for n in (inputs != PAD_ID).sum(axis=1)]
    limit = SourceLimit(str(export), tokenized=signature in SPLIT_SIGNATURES)
    return [limit.tokens(text.decode()) for text in inputs]


def test_the_warmup_file_runs_every_signature_and_a_long_sentence_and_a_batch(tiny_export):
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    logs = prediction_logs(tiny_export)
    assert 0 < len(logs) <= MAX_RECORDS
    assert {log.WhichOneof("log_type") for log in logs} == {"predict_log"}
    requests = [log.predict_log.request for log in logs]
    loaded = tf.saved_model.load(str(tiny_export))
    signatures = dict(loaded.signatures)
    assert {request.model_spec.signature_name for request in requests} == set(signatures)
    # serving_default: a short sentence, one of the longest source the export accepts, a batch.
    sources = [
        tf.make_ndarray(r.inputs["inputs"]) for r in requests if r.model_spec.signature_name == "serving_default"
    ]
    assert [len(inputs) for inputs in sources] == [1, 1, BATCH_SIZE]
    lengths = [source_lengths(tiny_export, "serving_default", inputs) for inputs in sources]
    assert lengths[0][0] <= SHORT_TOKENS and lengths[1] == [SourceLimit(str(tiny_export)).limit]  # 512
    assert max(lengths[2]) == lengths[1][0] and min(lengths[2]) == lengths[0][0]
    for index, request in enumerate(requests):  # as TF Serving replays them
        inputs = {key: tf.constant(tf.make_ndarray(value)) for key, value in request.inputs.items()}
        outputs = signatures[request.model_spec.signature_name](**inputs)
        rows = {int(output.shape[0]) for output in outputs.values()}
        assert rows == {len(inputs["inputs"])}, (index, request.model_spec.signature_name)


def test_nowarmup_leaves_the_file_out(tiny_run, tmp_path):
    export = export_cli(tiny_run, tmp_path / "m" / "1", "--ids_only", "--nowarmup")
    assert (export / EXPORT_INFO).exists() and not (export / WARMUP_REQUESTS).exists()

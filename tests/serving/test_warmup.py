"""tft-serve replays an export's warmup requests before its version serves, or fails the load saying why."""

import logging
import re
import shutil

import pytest
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_log_pb2

from tests.commands import export_cli
from tf_transformer.exporting.warmup_requests import MAX_RECORDS, WARMUP_REQUESTS
from tf_transformer.serving.metrics import ServingMetrics
from tf_transformer.serving.versions import ModelVersions
from tf_transformer.serving.warmup import WarmupError, read_warmup_requests


@pytest.fixture(scope="module")
def ids_export(tiny_run, tmp_path_factory):
    """``tiny_run`` exported by tft-export with ``--ids_only`` (two signatures: quick to load), warmup included."""
    return export_cli(tiny_run, tmp_path_factory.mktemp("warm") / "tiny_ids" / "1", "--ids_only")


def version_of(export, base, number, warmup: bytes | None = b"keep"):
    """A copy of ``export`` as version ``number`` under ``base``; ``warmup``: the warmup file's bytes instead
    of the export's (``None``: no file, as an export written before there was one)."""
    copy = shutil.copytree(export, base / str(number))
    if warmup is None:
        (copy / WARMUP_REQUESTS).unlink()
    elif warmup != b"keep":
        (copy / WARMUP_REQUESTS).write_bytes(warmup)
    return copy


def tfrecords(path, *messages):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for message in messages:
            writer.write(message if isinstance(message, bytes) else message.SerializeToString())
    return path.read_bytes()


def predict_log(signature="translate_ids", ids=((9, 3),)):
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(list(ids), dtype=tf.int32))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def scraped(versions) -> dict:
    text, _ = ServingMetrics([versions]).exposition()  # the models served: this one
    return {
        (sample.name, sample.labels.get("version")): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def test_a_version_warms_up_before_it_is_available_and_reports_how_long(ids_export, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    version_of(ids_export, tmp_path / "m", 1)
    versions = ModelVersions(str(tmp_path / "m"))
    versions.start(0)
    requests = len(read_warmup_requests(str(ids_export / WARMUP_REQUESTS)))
    metrics = scraped(versions)
    warmup, load = metrics[("tft_serving_model_warmup_seconds", "1")], metrics[("tft_serving_model_load_seconds", "1")]
    assert 0 < warmup < load  # the load time includes the warmup's
    assert f"Warmed up version 1 of m: {requests} requests in {warmup:.2f} s" in caplog.text
    outputs = versions.servable().run("translate_ids", [[9, 10, 3]])
    assert outputs["ids"].shape[0] == 1


def test_an_export_without_the_file_serves_without_warmup(ids_export, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    version_of(ids_export, tmp_path / "m", 1, warmup=None)
    versions = ModelVersions(str(tmp_path / "m"))
    versions.start(0)
    assert versions.servable().version == 1 and versions.warmup_seconds() == {1: 0.0}
    assert "Warmed up" not in caplog.text
    assert versions.servable().run("translate_ids", [[9, 10, 3]])["ids"].shape[0] == 1


def test_a_version_whose_warmup_fails_is_not_served_and_the_served_one_stays(ids_export, tmp_path):
    """As TF Serving: a warmup file that cannot be replayed fails that version's load, with the file named."""
    base = tmp_path / "m"
    version_of(ids_export, base, 1)
    versions = ModelVersions(str(base))
    versions.start(0)
    classify = prediction_log_pb2.PredictionLog(
        classify_log=prediction_log_pb2.ClassifyLog(request=classification_pb2.ClassificationRequest())
    )
    bad = version_of(ids_export, base, 2, tfrecords(tmp_path / "bad", predict_log(), classify))
    versions.poll()
    [status] = versions.status("2")["model_version_status"]
    assert status["state"] == "END"
    message = status["status"]["error_message"]
    assert message == f"WarmupError: {bad / WARMUP_REQUESTS}: record 1 is a classify_log, not a predict_log"
    assert versions.servable().version == 1

    unknown = version_of(ids_export, base, 3, tfrecords(tmp_path / "unknown", predict_log("translate")))
    versions.poll()
    message = versions.status("3")["model_version_status"][0]["status"]["error_message"]
    assert f"{unknown / WARMUP_REQUESTS}: record 0 asks for signature 'translate'" in message
    assert versions.servable().version == 1

    failing = version_of(ids_export, base, 4, tfrecords(tmp_path / "failing", predict_log(ids=((9, 10_000, 3),))))
    versions.poll()
    message = versions.status("4")["model_version_status"][0]["status"]["error_message"]
    assert f"{failing / WARMUP_REQUESTS}: record 0 (translate_ids) failed: Token ids must be below" in message
    assert versions.servable().version == 1


def test_files_tf_serving_would_refuse_are_refused_naming_file_and_record(tmp_path):
    path = tmp_path / "requests"
    path.write_bytes(b"not a TFRecord file at all")
    with pytest.raises(WarmupError, match=f"^{re.escape(str(path))}: record 0 is not a TFRecord"):
        read_warmup_requests(str(path))

    whole = tfrecords(path, predict_log(), predict_log())
    path.write_bytes(whole[:-3])  # the second record cut short
    with pytest.raises(WarmupError, match=f"^{re.escape(str(path))}: record 1 is not a TFRecord"):
        read_warmup_requests(str(path))

    tfrecords(path, predict_log(), b"\x32\xff")  # a length past the end: not a PredictionLog
    with pytest.raises(WarmupError, match=f"^{re.escape(str(path))}: record 1 is not a PredictionLog$"):
        read_warmup_requests(str(path))

    tfrecords(path, predict_log(), prediction_log_pb2.PredictionLog())
    with pytest.raises(WarmupError, match="record 1 is an empty PredictionLog, not a predict_log"):
        read_warmup_requests(str(path))

    tfrecords(path, *[predict_log()] * MAX_RECORDS)
    assert len(read_warmup_requests(str(path))) == MAX_RECORDS
    tfrecords(path, *[predict_log()] * (MAX_RECORDS + 1))
    with pytest.raises(WarmupError, match=f"^{re.escape(str(path))}: more than 1000 records"):
        read_warmup_requests(str(path))

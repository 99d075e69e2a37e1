"""tft-serve's gRPC API through the stock ``tensorflow-serving-api`` client: what a TF Serving client gets.

Stand-in models (no graph) check the codes and limits; the tiny export checks
that gRPC answers what REST answers, and metadata.
"""

import concurrent.futures
import pathlib
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from configs.serving import ServingOptions
from tests.serving.client import request
from tf_transformer.serving import ModelServer, make_server
from tf_transformer.serving.models import ModelRegistry
from tf_transformer.serving.versions import ModelVersions, VersionPolicy


class Upper:
    """A stand-in servable: upper-cases its sentences after ``seconds``; ``version`` is its directory's number."""

    input_kinds = {"serving_default": "strings", "translate_ids": "ids"}

    def __init__(self, path, version, seconds=0.0):
        self.path, self.version, self.seconds = path, version, seconds

    def check(self, request):
        pass

    def warm_up(self):
        return 0, 0.0  # no warmup file

    def run(self, signature, rows):
        time.sleep(self.seconds)
        if signature == "translate_ids":
            return {"ids": np.array([[i + 1 for i in row] for row in rows], np.int32)}
        return {"translations": np.array([f"{row.upper()} v{self.version}".encode() for row in rows], object)}

    def fit(self, signature, rows, outputs):
        return outputs


def add_versions(base: pathlib.Path, *numbers):
    for number in numbers:
        (base / str(number)).mkdir(parents=True)
        (base / str(number) / "saved_model.pb").write_bytes(b"graph")


def serve(models, config_poll_seconds=0.0, **options):
    """A server of ``models`` on free ports, serving in a thread once loaded, and a gRPC channel to it."""
    options = ServingOptions(**{"port": 0, "rest_api_port": 0, "file_system_poll_wait_seconds": 0, **options})
    server = ModelServer(models, options)
    models.start(0, config_poll_seconds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    assert models.wait_loaded(30)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_address[1]}")
    return server, channel


def strings(*values):
    return tf.make_tensor_proto(np.array([v.encode() if isinstance(v, str) else v for v in values], object))


def predict_request(model, tensor, signature="", version=None, label=None, **inputs):
    message = predict_pb2.PredictRequest()
    message.model_spec.name = model
    message.model_spec.signature_name = signature
    if version is not None:
        message.model_spec.version.value = version
    if label is not None:
        message.model_spec.version_label = label
    message.inputs["inputs"].CopyFrom(tensor)
    for name, value in inputs.items():
        message.inputs[name].CopyFrom(value)
    return message


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code(), raised.value.details()


@pytest.fixture
def two_versions(tmp_path):
    """A server of model ``m`` with versions 1 and 2 served (latest 2), ``stable`` labelling 1."""
    add_versions(tmp_path / "m", 1, 2)
    versions = ModelVersions(
        str(tmp_path / "m"), load=Upper, policy=VersionPolicy("latest", 2), labels={"stable": 1}, must_exist=False
    )
    server, channel = serve(ModelRegistry([versions]), max_batch_size=4)
    yield server, prediction_service_pb2_grpc.PredictionServiceStub(channel), channel
    channel.close()
    server.stop()


def test_predict_by_version_label_or_latest_and_every_client_error_code(two_versions):
    server, stub, channel = two_versions
    answer = stub.Predict(predict_request("m", strings("a b", "c")), timeout=10)
    assert [t.decode() for t in tf.make_ndarray(answer.outputs["translations"])] == ["A B v2", "C v2"]
    assert answer.model_spec.name == "m" and answer.model_spec.version.value == 2
    assert answer.model_spec.signature_name == "serving_default"
    by_version = stub.Predict(predict_request("m", strings("x"), version=1), timeout=10)
    by_label = stub.Predict(predict_request("m", strings("x"), label="stable"), timeout=10)
    assert tf.make_ndarray(by_version.outputs["translations"]).tolist() == [b"X v1"]
    assert by_label.outputs["translations"] == by_version.outputs["translations"]
    ids = stub.Predict(
        predict_request("m", tf.make_tensor_proto(np.array([[5, 3]], np.int32)), "translate_ids"), timeout=10
    )
    assert tf.make_ndarray(ids.outputs["ids"]).tolist() == [[6, 4]]

    not_found = grpc.StatusCode.NOT_FOUND
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (predict_request("other", strings("a")), not_found, "No model named 'other'"),
        (predict_request("m", strings("a"), version=7), not_found, "Version 7 of m is not being served"),
        (predict_request("m", strings("a"), label="canary"), not_found, "labelled 'canary'"),
        (predict_request("m", strings("a"), "nope"), invalid, "Unknown signature_name 'nope'"),
        (predict_request("m", tf.make_tensor_proto(np.array([1, 2], np.int32))), invalid, "takes strings"),
        (predict_request("m", strings(b"\xff\xfe")), invalid, "not UTF-8"),
        (predict_request("m", strings(*"abcde")), invalid, "Batch of 5 sentences exceeds the maximum of 4"),
        (predict_request("m", strings("a"), extra=strings("b")), invalid, "only input is 'inputs'"),
        (predict_request("m", tf.make_tensor_proto(np.array([True]))), invalid, "dtype bool"),
    ]
    for message, code, words in cases:
        got, details = code_of(lambda message=message: stub.Predict(message, timeout=10))
        assert (got, words in details) == (code, True), (got, details)
    filtered = predict_request("m", strings("a"))
    filtered.output_filter.append("scores")
    got, details = code_of(lambda: stub.Predict(filtered, timeout=10))
    assert got == invalid and "output_filter names ['scores']" in details

    status_stub = model_service_pb2_grpc.ModelServiceStub(channel)
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "m"
    states = {s.version: s.state for s in status_stub.GetModelStatus(status, timeout=10).model_version_status}
    assert states == {2: 30, 1: 30}  # AVAILABLE
    status.model_spec.version_label = "stable"
    [only] = status_stub.GetModelStatus(status, timeout=10).model_version_status
    assert only.version == 1
    status.model_spec.name = "other"
    assert code_of(lambda: status_stub.GetModelStatus(status, timeout=10))[0] == not_found

    # Both APIs count in one place.
    _, text = request(server.server_address[1], "GET", "/monitoring/prometheus/metrics", parse=False)
    assert 'protocol="grpc",signature="serving_default",status="OK"' in text
    assert 'api="predict",model="other",protocol="grpc",signature="",status="NOT_FOUND"' in text


def test_a_full_queue_is_resource_exhausted_and_a_missed_deadline_gives_up_its_place(tmp_path):
    add_versions(tmp_path / "m", 1)
    versions = ModelVersions(str(tmp_path / "m"), load=lambda path, version: Upper(path, version, seconds=1.0))
    server, channel = serve(
        ModelRegistry([versions]), max_batch_size=1, max_enqueued_batches=1, batch_timeout_micros=0, num_batch_threads=1
    )
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = pool.submit(stub.Predict, predict_request("m", strings("a")), timeout=30)
            time.sleep(0.3)  # running: the queue is empty again
            second = pool.submit(stub.Predict, predict_request("m", strings("b")), timeout=30)
            time.sleep(0.3)  # queued: the queue is full
            got, details = code_of(lambda: stub.Predict(predict_request("m", strings("c")), timeout=30))
            assert got == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue is full" in details
            assert first.result().outputs["translations"] and second.result().outputs["translations"]
        got, _ = code_of(lambda: stub.Predict(predict_request("m", strings("d")), timeout=0.3))
        assert got == grpc.StatusCode.DEADLINE_EXCEEDED
        assert stub.Predict(predict_request("m", strings("e")), timeout=30).outputs["translations"]
    finally:
        channel.close()
        server.stop()


def test_a_request_over_max_request_bytes_is_refused(tmp_path):
    add_versions(tmp_path / "m", 1)
    server, channel = serve(ModelRegistry([ModelVersions(str(tmp_path / "m"), load=Upper)]), max_request_bytes=1000)
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        got, _ = code_of(lambda: stub.Predict(predict_request("m", strings("a" * 5000)), timeout=10))
        assert got == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Predict(predict_request("m", strings("a")), timeout=10).outputs["translations"]
    finally:
        channel.close()
        server.stop()


def test_grpc_answers_what_rest_answers_and_gives_the_signatures(tiny_export):
    options = ServingOptions(port=0, rest_api_port=0, file_system_poll_wait_seconds=0)
    server = make_server(str(tiny_export), options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_address[1]}")
    name = server.versions.name
    try:
        assert server.versions.wait_loaded(300)
        sentences = ["alpha beta gamma", "haus", ""]
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer = stub.Predict(predict_request(name, strings(*sentences)), timeout=60)
        status, rest = request(
            server.server_address[1], "POST", f"/v1/models/{name}:predict", {"inputs": sentences}, timeout=60
        )
        assert status == 200
        assert [t.decode() for t in tf.make_ndarray(answer.outputs["translations"])] == rest["outputs"]["translations"]
        np.testing.assert_allclose(tf.make_ndarray(answer.outputs["scores"]), rest["outputs"]["scores"], rtol=1e-6)
        got, details = code_of(lambda: stub.Predict(predict_request(name, strings("a", "zeta " * 600)), timeout=60))
        assert got == grpc.StatusCode.INVALID_ARGUMENT and "input 1: 601 tokens (EOS included) is longer" in details

        metadata_request = get_model_metadata_pb2.GetModelMetadataRequest()
        metadata_request.model_spec.name = name
        metadata_request.metadata_field.append("signature_def")
        metadata = stub.GetModelMetadata(metadata_request, timeout=30)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        assert metadata.metadata["signature_def"].Unpack(signatures)
        _, rest_metadata = request(server.server_address[1], "GET", f"/v1/models/{name}/metadata", timeout=30)
        assert set(signatures.signature_def) == set(rest_metadata["metadata"]["signature_def"]["signature_def"])
        assert signatures.signature_def["serving_default"].inputs["inputs"].dtype == tf.string.as_datatype_enum
        metadata_request.metadata_field[0] = "nothing"
        assert code_of(lambda: stub.GetModelMetadata(metadata_request, timeout=30))[0] == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
    finally:
        channel.close()
        server.stop()


def test_a_grpc_and_a_rest_request_share_one_batch(tmp_path):
    """One batching queue behind both APIs: concurrent requests of either are merged."""
    add_versions(tmp_path / "m", 1)
    batches = []

    class Recording(Upper):
        def run(self, signature, rows):
            batches.append(len(rows))
            return super().run(signature, rows)

    server, channel = serve(
        ModelRegistry([ModelVersions(str(tmp_path / "m"), load=Recording)]),
        max_batch_size=2,
        batch_timeout_micros=10_000_000,  # the batch runs once both have arrived
        num_batch_threads=1,
    )
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            over_grpc = pool.submit(stub.Predict, predict_request("m", strings("g")), timeout=30)
            over_rest = pool.submit(
                request, server.server_address[1], "POST", "/v1/models/m:predict", {"instances": ["r"]}
            )
            assert tf.make_ndarray(over_grpc.result().outputs["translations"]).tolist() == [b"G v1"]
            assert over_rest.result() == (200, {"predictions": [{"translations": "R v1"}]})
        assert batches == [2]
    finally:
        channel.close()
        server.stop()

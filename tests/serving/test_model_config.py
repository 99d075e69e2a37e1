"""Several models from TF Serving's model config file: read with its own protos, errors naming the line,
version policies, a model that fails alone, and the file read again while serving (stand-in models)."""

import time

import grpc
import pytest
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc, prediction_service_pb2_grpc

from tests.serving.client import request
from tests.serving.test_grpc import Upper, add_versions, code_of, predict_request, serve, strings
from tf_transformer.serving.model_config import ModelConfigError, parse_model_config, read_model_config
from tf_transformer.serving.models import ModelRegistry
from tf_transformer.serving.versions import VersionPolicy

CONFIG = """
model_config_list {
  config {
    name: "translate"
    base_path: "%(root)s/translate"
    model_platform: "tensorflow"
    model_version_policy { latest { num_versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 3 }
  }
  config {
    name: "parse"
    base_path: "%(root)s/parse"
    model_version_policy { specific { versions: 1 } }
  }
  config { name: "every" base_path: "%(root)s/every" model_version_policy { all {} } }
  config { name: "missing" base_path: "%(root)s/missing" }
}
"""


def test_the_file_is_read_with_tf_servings_message_and_policies_kept():
    specs = parse_model_config(CONFIG % {"root": "/models"})
    assert [(s.name, s.base_path, s.policy, s.labels) for s in specs] == [
        ("translate", "/models/translate", VersionPolicy("latest", 2), {"stable": 1, "canary": 3}),
        ("parse", "/models/parse", VersionPolicy("specific", versions=(1,)), {}),
        ("every", "/models/every", VersionPolicy("all"), {}),
        ("missing", "/models/missing", VersionPolicy(), {}),
    ]
    assert VersionPolicy("latest", 2).choose([1, 5, 3]) == {5, 3}
    assert VersionPolicy("specific", versions=(1, 9)).choose([1, 2]) == {1}


@pytest.mark.parametrize(
    "text, words",
    [
        (
            'model_config_list {\n  config {\n    name: "a"\n    bogus: 1\n  }\n}',
            'm.config:4:5 : Message type "tensorflow',
        ),
        ("model_config_list {\n  config {\n", "m.config:2:10 : Expected"),
        (
            'model_config_list {\n config { name: "a" base_path: "/a" }\n config { name: "a" base_path: "/b" }\n}',
            "m.config:3: model 'a' is configured twice",
        ),
        ('model_config_list {\n config { base_path: "/a" }\n}', "m.config:2: model 1 has no name"),
        ('model_config_list {\n config { name: "a" }\n}', "m.config:2: model 'a' has no base_path"),
        ('model_config_list {\n config { name: "a/b" base_path: "/a" }\n}', "must not hold '/' or ':'"),
        (
            'model_config_list {\n\n config { name: "a" base_path: "/a" model_platform: "pytorch" }\n}',
            "m.config:3: model 'a' has model_platform 'pytorch'",
        ),
        ('model_config_list {\n config { name: "a" base_path: "/a"\n model_version_policy { latest { } } } }', None),
        (
            'model_config_list { config { name: "a" base_path: "/a" version_labels { key: "x" value: 2 }\n'
            " model_version_policy { specific { versions: 1 } } } }",
            "labels versions [2] that its specific policy",
        ),
        ("", "m.config: no model"),
        ("custom_model_config {}", "custom_model_config is not served"),
    ],
)
def test_a_bad_file_is_an_error_naming_the_line(text, words):
    if words is None:  # latest without num_versions: TF Serving's default of 1
        assert parse_model_config(text, "m.config")[0].policy == VersionPolicy("latest", 1)
        return
    with pytest.raises(ModelConfigError) as raised:
        parse_model_config(text, "m.config")
    assert words in str(raised.value)


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(ModelConfigError, match="nope.config: cannot read"):
        read_model_config(str(tmp_path / "nope.config"))


def test_models_of_one_file_serve_side_by_side_and_one_that_fails_does_not_stop_the_others(tmp_path):
    add_versions(tmp_path / "translate", 1, 2, 3)
    add_versions(tmp_path / "parse", 1, 2)
    add_versions(tmp_path / "every", 4, 5)
    config = tmp_path / "models.config"
    config.write_text(CONFIG % {"root": tmp_path})
    models = ModelRegistry.from_config_file(str(config), load=Upper)
    server, channel = serve(models)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    status_stub = model_service_pb2_grpc.ModelServiceStub(channel)
    port = server.server_address[1]

    def translation(model, **spec):
        answer = stub.Predict(predict_request(model, strings("a"), **spec), timeout=10)
        return answer.outputs["translations"].string_val[0].decode()

    def versions_of(model):
        message = get_model_status_pb2.GetModelStatusRequest()
        message.model_spec.name = model
        return {s.version: s.state for s in status_stub.GetModelStatus(message, timeout=10).model_version_status}

    try:
        assert translation("translate") == "A v3"
        assert translation("translate", version=2) == "A v2"
        got, details = code_of(lambda: translation("translate", label="stable"))  # version 1 is not served
        assert got == grpc.StatusCode.NOT_FOUND and "Version 1 of translate is not being served" in details
        assert translation("translate", label="canary") == "A v3"
        assert translation("parse") == "A v1"  # specific: 1, though 2 is newer
        assert translation("every", version=4) == "A v4" and translation("every") == "A v5"
        assert versions_of("translate") == {3: 30, 2: 30}
        assert request(port, "POST", "/v1/models/translate/labels/canary:predict", {"instances": ["b"]}) == (
            200,
            {"predictions": [{"translations": "B v3"}]},
        )
        assert request(port, "POST", "/v1/models/parse:predict", {"instances": ["b"]})[1] == {
            "predictions": [{"translations": "B v1"}]
        }
        got, details = code_of(lambda: versions_of("missing"))  # its status says why it serves nothing
        assert got == grpc.StatusCode.NOT_FOUND and f"{tmp_path}/missing does not exist" in details
        status, body = request(port, "GET", "/readyz")
        assert status == 200 and body["models"] == ["translate", "parse", "every", "missing"]

        # The file read again: a policy changed, a model removed, one added; a broken file changes nothing.
        add_versions(tmp_path / "added", 1)
        every = 'config { name: "every" base_path: "%(root)s/every" model_version_policy { all {} } }'
        changed = CONFIG.replace("num_versions: 2", "num_versions: 1")
        changed = changed.replace(every, 'config { name: "added" base_path: "%(root)s/added" }')
        config.write_text(changed % {"root": tmp_path})
        models.reload()
        assert models.names == ["translate", "parse", "added", "missing"]
        assert versions_of("translate") == {3: 30, 2: 50}  # 2 is unloaded: END
        assert models.get("added").wait_loaded(10) and translation("added") == "A v1"
        assert code_of(lambda: translation("every"))[0] == grpc.StatusCode.NOT_FOUND
        config.write_text("model_config_list { config {")
        models.reload()
        assert models.names == ["translate", "parse", "added", "missing"]
    finally:
        channel.close()
        server.stop()


def test_the_file_is_polled_while_serving(tmp_path):
    add_versions(tmp_path / "a", 1)
    add_versions(tmp_path / "b", 1)
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "a" base_path: "{tmp_path}/a" }} }}')
    models = ModelRegistry.from_config_file(str(config), load=Upper)
    server, channel = serve(models, config_poll_seconds=0.05)
    try:
        config.write_text(
            f'model_config_list {{ config {{ name: "a" base_path: "{tmp_path}/a" }}'
            f' config {{ name: "b" base_path: "{tmp_path}/b" }} }}'
        )
        deadline = time.monotonic() + 10
        while "b" not in models.names:
            assert time.monotonic() < deadline, "the new model was not picked up"
            time.sleep(0.05)
        assert models.get("b").wait_loaded(10)
    finally:
        channel.close()
        server.stop()


def test_a_client_reloads_the_config_over_grpc(tmp_path):
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2

    add_versions(tmp_path / "a", 1)
    add_versions(tmp_path / "b", 3)
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "a" base_path: "{tmp_path}/a" }} }}')
    models = ModelRegistry.from_config_file(str(config), load=Upper)
    server, channel = serve(models)
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    try:
        message = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(f'model_config_list {{ config {{ name: "b" base_path: "{tmp_path}/b" }} }}', message.config)
        assert stub.HandleReloadConfigRequest(message, timeout=10).status.error_code == 0
        assert models.names == ["b"] and models.get("b").wait_loaded(10)
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert predict.Predict(predict_request("b", strings("x")), timeout=10).model_spec.version.value == 3
        message.config.model_config_list.config[0].ClearField("base_path")
        answer = stub.HandleReloadConfigRequest(message, timeout=10)
        assert answer.status.error_code == 3 and "model 'b' has no base_path" in answer.status.error_message
        assert models.names == ["b"]
    finally:
        channel.close()
        server.stop()

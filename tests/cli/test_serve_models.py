"""tft-serve's flags for several models and gRPC: a model config file, TF Serving's ports, a stock gRPC client."""

import os
import shutil
import subprocess
import sys

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc, prediction_service_pb2_grpc

from tests.serving.client import Server
from tests.serving.test_grpc import predict_request, strings

BIN = os.path.dirname(sys.executable)


def tft_serve(*flags) -> subprocess.CompletedProcess:
    return subprocess.run(
        [os.path.join(BIN, "tft-serve"), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def test_flag_mistakes_are_usage_errors(tmp_path):
    both = tft_serve("--model", str(tmp_path), "--model_config_file", str(tmp_path / "m.config"))
    assert both.returncode != 0 and "--model (one model) or --model_config_file (several)" in both.stderr
    (tmp_path / "m.config").write_text('model_config_list {\n config { name: "a"\n  base_pth: "/x" } }\n')
    bad = tft_serve("--model_config_file", str(tmp_path / "m.config"))
    assert bad.returncode != 0 and f"{tmp_path / 'm.config'}:3:" in bad.stderr and "base_pth" in bad.stderr


def test_port_alone_says_it_now_means_grpc(tmp_path):
    """--port meant REST before gRPC: given alone, tft-serve says where REST is rather than move it silently."""
    moved = tft_serve("--model", str(tmp_path / "nothing"), "--port", "8599")
    assert "--port 8599 is the gRPC port, as TF Serving's --port; REST listens on --rest_api_port (8501)" in (
        moved.stderr
    )


def test_a_translator_and_a_parser_from_one_config_file_over_grpc_and_rest(tiny_export, tiny_parser, tmp_path):
    shutil.copytree(tiny_export.parent, tmp_path / "translate")
    shutil.copytree(tiny_export, tmp_path / "translate" / "2")
    shutil.copytree(tiny_parser[1], tmp_path / "ptb" / "1")
    config = tmp_path / "models.config"
    config.write_text(
        "model_config_list {\n"
        f' config {{ name: "translate" base_path: "{tmp_path}/translate" version_labels {{ key: "stable" value: 1 }}\n'
        "   model_version_policy { latest { num_versions: 2 } } }\n"
        f' config {{ name: "ptb" base_path: "{tmp_path}/ptb" }}\n'
        f' config {{ name: "broken" base_path: "{tmp_path}/broken" }}\n'
        "}\n"
    )
    server = Server(None, "--model_config_file", str(config))
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        sentences = ["alpha beta", "zeta"]
        answers = {
            (model, label): stub.Predict(predict_request(model, strings(*sentences), label=label), timeout=60)
            for model, label in [("translate", None), ("translate", "stable"), ("ptb", None)]
        }
        assert [answer.model_spec.version.value for answer in answers.values()] == [2, 1, 1]
        texts = {key: tf.make_ndarray(answer.outputs["translations"]).tolist() for key, answer in answers.items()}
        assert texts[("translate", None)] == texts[("translate", "stable")]  # one export as two versions
        for model, key in (("translate", ("translate", None)), ("ptb", ("ptb", None))):
            status, rest = server.post({"inputs": sentences}, path=f"/v1/models/{model}:predict")
            assert status == 200 and [t.encode() for t in rest["outputs"]["translations"]] == texts[key]
            np.testing.assert_allclose(rest["outputs"]["scores"], tf.make_ndarray(answers[key].outputs["scores"]))
        trees = [tree.decode() for tree in tf.make_ndarray(answers[("ptb", None)].outputs["trees"])]
        assert trees == rest["outputs"]["trees"] and all(tree.startswith("(") for tree in trees)

        status_stub = model_service_pb2_grpc.ModelServiceStub(channel)
        message = get_model_status_pb2.GetModelStatusRequest()
        message.model_spec.name = "translate"
        assert [s.version for s in status_stub.GetModelStatus(message, timeout=30).model_version_status] == [2, 1]
        message.model_spec.name = "broken"
        try:
            status_stub.GetModelStatus(message, timeout=30)
            raise AssertionError("a model that serves nothing has no status")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND and "broken does not exist" in error.details()
    finally:
        channel.close()
        server.stop()

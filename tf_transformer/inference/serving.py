"""A small server for an exported model speaking TF Serving's REST predict API.

TF Serving itself is the production server (see the README for its Docker
command); this one serves the same SavedModel with the same request and response
formats, so client code works against both, where TF Serving cannot be installed.

  GET  /v1/models/<name>                       model status
  GET  /v1/models/<name>/versions/<v>          model status
  POST /v1/models/<name>[/versions/<v>]:predict
       {"instances": ["a sentence", …]}            → {"predictions": [{"translations": …, "scores": …}, …]}
       {"inputs": ["a sentence", …]}               → {"outputs": {"translations": […], "scores": […]}}
       optional "signature_name": "serving_default" | "translate_ids"
Errors are HTTP 400 (bad request) or 404 (unknown model or path) with {"error": "…"}.
"""

from __future__ import annotations

import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

_PATH = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?P<verb>:predict)?$")


class BadRequest(ValueError):
    """A client error reported as HTTP 400."""


def resolve_model(path: str) -> tuple[str, str, str]:
    """``(name, version, directory)`` for a version directory or a base directory of versions."""
    path = os.path.abspath(path)
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return os.path.basename(os.path.dirname(path)), os.path.basename(path), path
    versions = sorted((int(v) for v in os.listdir(path) if v.isdigit()), reverse=True) if os.path.isdir(path) else []
    for version in versions:
        candidate = os.path.join(path, str(version))
        if os.path.exists(os.path.join(candidate, "saved_model.pb")):
            return os.path.basename(path), str(version), candidate
    raise FileNotFoundError(f"No SavedModel at {path} (nor in numbered version directories under it)")


class ModelServer:
    """Holds the loaded SavedModel and answers predict requests (thread-safe)."""

    def __init__(self, model_path: str, max_batch_size: int = 64):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

        self.name, self.version, self.path = resolve_model(model_path)
        self.loaded = tf.saved_model.load(self.path)
        self.signatures = dict(self.loaded.signatures)
        self.max_batch_size = max_batch_size
        self._lock = threading.Lock()
        self._tf = tf

    def status(self) -> dict:
        return {
            "model_version_status": [
                {"version": self.version, "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ]
        }

    def predict(self, body: dict) -> dict:
        tf = self._tf
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object")
        name = body.get("signature_name", "serving_default")
        if name not in self.signatures:
            raise BadRequest(f"Unknown signature_name {name!r}; available: {sorted(self.signatures)}")
        row_format = "instances" in body
        if row_format == ("inputs" in body):
            raise BadRequest("Request must have exactly one of 'instances' (row format) or 'inputs' (columnar)")
        values = body["instances"] if row_format else body["inputs"]
        if isinstance(values, dict):  # {"inputs": {"inputs": [...]}} names the signature input explicitly
            values = values.get("inputs")
        if row_format and values and isinstance(values[0], dict):
            values = [instance.get("inputs") for instance in values]
        if not isinstance(values, list) or not values:
            raise BadRequest("Inputs must be a non-empty list")
        if len(values) > self.max_batch_size:
            raise BadRequest(f"Batch of {len(values)} exceeds the maximum of {self.max_batch_size}")
        if name == "serving_default":
            if not all(isinstance(v, str) for v in values):
                raise BadRequest("serving_default takes a list of strings")
            tensor = tf.constant(values, tf.string)
        else:
            if not all(isinstance(row, list) and all(isinstance(i, int) for i in row) for row in values):
                raise BadRequest(f"{name} takes a list of lists of token ids")
            width = max(len(row) for row in values)
            tensor = tf.constant([row + [0] * (width - len(row)) for row in values], tf.int32)
        with self._lock:
            outputs = self.signatures[name](inputs=tensor)
        outputs = {key: _jsonable(value.numpy()) for key, value in outputs.items()}
        if row_format:
            return {"predictions": [{key: outputs[key][i] for key in outputs} for i in range(len(values))]}
        return {"outputs": outputs}


def _jsonable(array: np.ndarray):
    if array.dtype == object:
        return [v.decode("utf-8") if isinstance(v, bytes) else _jsonable(np.asarray(v)) for v in array.tolist()]
    return array.tolist()


def make_handler(server: ModelServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, code: int, payload: dict):
            data = json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self):
            match = _PATH.match(self.path)
            if not match or match["name"] != server.name:
                return None
            if match["version"] and match["version"] != server.version:
                return None
            return match

        def do_GET(self):  # noqa: N802 (http.server API)
            match = self._route()
            if match is None or match["verb"]:
                return self._reply(404, {"error": f"No model at {self.path}; serving /v1/models/{server.name}"})
            return self._reply(200, server.status())

        def do_POST(self):  # noqa: N802
            match = self._route()
            if match is None or not match["verb"]:
                return self._reply(404, {"error": f"POST /v1/models/{server.name}:predict"})
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                return self._reply(400, {"error": f"Malformed JSON: {error}"})
            try:
                return self._reply(200, server.predict(body))
            except BadRequest as error:
                return self._reply(400, {"error": str(error)})
            except Exception as error:  # a model failure must not take the server down
                return self._reply(500, {"error": f"{type(error).__name__}: {error}"})

        def log_message(self, format, *args):  # noqa: A002 (quiet by default)
            pass

    return Handler


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8501, max_batch_size: int = 64, ready=None):
    """Serves until interrupted. ``ready(server)`` is called once listening."""
    model = ModelServer(model_path, max_batch_size)
    httpd = ThreadingHTTPServer((host, port), make_handler(model))
    httpd.daemon_threads = True
    if ready:
        ready(httpd, model)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()

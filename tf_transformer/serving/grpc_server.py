"""TF Serving's gRPC API on grpcio: ``PredictionService`` (Predict, GetModelMetadata) and ``ModelService``
(GetModelStatus), from ``tensorflow-serving-api``'s own protos.

Most TF Serving clients speak gRPC: ``PredictionServiceStub(channel).Predict(request, timeout)``
with ``inputs`` as ``TensorProto``s. Such a client gets here what it gets from
TF Serving, and what the REST API answers the same request: a request's tensors
become the columnar JSON body REST would have carried and go through the same
checks (:func:`~.rest_api.parse_predict`, the servable's limits) and the same
batching queue (:class:`~.core.ServingCore`). Errors are TF Serving's codes:

- ``INVALID_ARGUMENT``: a tensor of the wrong type or shape, not UTF-8, over a
  limit, an unknown signature or output (the message names which);
- ``NOT_FOUND``: no such model, version or label;
- ``RESOURCE_EXHAUSTED``: the batching queue is full, or the answer is over
  ``--max_response_bytes`` (a request over ``--max_request_bytes`` is refused
  by grpcio itself with the same code);
- ``UNAVAILABLE``: no version loaded yet, or the server stopping;
- ``DEADLINE_EXCEEDED``: the client's deadline passed while the request waited
  or ran (its place in the queue is given up if it had not started).

``ModelService.HandleReloadConfigRequest`` serves the models of the config it
carries instead of the current ones, checked as a config file is
(:mod:`.model_config`). ``Classify``, ``Regress`` and ``MultiInference``
answer ``UNIMPLEMENTED`` (grpcio's default), as docs/serving.md says.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import time

import grpc
import numpy as np
from absl import logging

from tf_transformer.exporting.export_info import graph_error
from tf_transformer.serving.core import ServingCore, refused_by_graph
from tf_transformer.serving.model_config import ModelConfigError, parse_model_config
from tf_transformer.serving.rest_api import ClientError, NotFound, QueueFull, Unavailable, parse_predict
from tf_transformer.serving.versions import AVAILABLE, END, LOADING

_STATES = {LOADING: 20, AVAILABLE: 30, END: 50}  # ModelVersionStatus.State's numbers
_ERROR_CODE_UNKNOWN = 2  # tensorflow.error.Code.UNKNOWN, a failed load's code in TF Serving's status
_ERROR_CODE_INVALID_ARGUMENT = 3  # tensorflow.error.Code.INVALID_ARGUMENT


class GrpcServer:
    """The gRPC server over ``core``: binds at once (``core.options.port``); :meth:`start`, :meth:`stop`."""

    def __init__(self, core: ServingCore):
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        options = core.options
        self.core = core
        self.server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(options.grpc_max_threads, thread_name_prefix="grpc"),
            options=[
                ("grpc.max_receive_message_length", options.max_request_bytes),
                ("grpc.max_send_message_length", options.max_response_bytes),
                ("grpc.so_reuseport", 0),  # a second server on a taken port fails, as the REST socket does
            ],
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            _servicer(_PredictionService, prediction_service_pb2_grpc.PredictionServiceServicer)(core), self.server
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            _servicer(_ModelService, model_service_pb2_grpc.ModelServiceServicer)(core), self.server
        )
        address = f"{options.host}:{options.port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as error:  # grpcio raises where it cannot bind
            raise OSError(f"gRPC cannot listen at {address}: {error}") from None
        self.server_address = (options.host, self.port)

    def start(self) -> None:
        self.server.start()

    def stop(self, grace: float | None = None) -> None:
        """Refuses new calls and waits up to ``grace`` seconds for those in flight."""
        self.server.stop(grace).wait()


class _Answered:
    """Times a call and counts it under its model, API, signature and gRPC code when it ends."""

    def __init__(self, core: ServingCore, api: str, model: str):
        self.core, self.api, self.model, self.signature = core, api, model, ""
        self.started = time.perf_counter()

    def __call__(self, code: grpc.StatusCode) -> None:
        seconds = time.perf_counter() - self.started
        self.core.metrics.answered(self.model, "grpc", self.api, self.signature, code.name, seconds)


def _abort(context, answered: _Answered, code: grpc.StatusCode, message: str):
    answered(code)
    context.abort(code, message)


def _code(error: Exception) -> grpc.StatusCode:
    if isinstance(error, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, QueueFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, Unavailable):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INVALID_ARGUMENT


def _spec_version(spec) -> str | None:
    """The version number a ``ModelSpec`` names, as REST's path carries it (``None``: none named)."""
    return str(spec.version.value) if spec.HasField("version") else None


def _version(versions, spec):
    """The servable a ``ModelSpec`` names: by version, by label, or the highest served."""
    return versions.servable(_spec_version(spec), spec.version_label or None)


class _PredictionService:
    """``tensorflow.serving.PredictionService``: Predict and GetModelMetadata."""

    def __init__(self, core: ServingCore):
        self.core = core

    def Predict(self, request, context):  # noqa: N802 (the proto's method name)
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        answered = _Answered(self.core, "predict", request.model_spec.name)
        try:
            versions = self.core.models.get(request.model_spec.name)
            servable = _version(versions, request.model_spec)
            signature = request.model_spec.signature_name or "serving_default"
            answered.signature = signature
            if signature not in servable.input_kinds:
                raise ClientError(f"Unknown signature_name {signature!r}; available: {sorted(servable.input_kinds)}")
            body = {"signature_name": signature, "inputs": _request_inputs(request.inputs)}
            parsed = parse_predict(body, servable.input_kinds, self.core.options.max_batch_size)
            servable.check(parsed)
            future = self.core.submit(versions.name, servable, parsed)
        except ClientError as error:
            return _abort(context, answered, _code(error), str(error))
        try:
            outputs = future.result(timeout=context.time_remaining())
        except concurrent.futures.TimeoutError:
            future.cancel()  # not started yet: its place in the queue is given up
            return _abort(context, answered, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline exceeded")
        except Exception as error:
            if refused_by_graph(error):  # the graph refused the input: the client's mistake
                return _abort(context, answered, grpc.StatusCode.INVALID_ARGUMENT, graph_error(error))
            logging.exception("gRPC Predict failed")
            return _abort(context, answered, grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")
        if request.output_filter:
            unknown = sorted(set(request.output_filter) - set(outputs))
            if unknown:
                message = f"output_filter names {unknown}, not outputs of {signature}: {sorted(outputs)}"
                return _abort(context, answered, grpc.StatusCode.INVALID_ARGUMENT, message)
            outputs = {key: value for key, value in outputs.items() if key in set(request.output_filter)}
        response = predict_pb2.PredictResponse()
        response.model_spec.name = versions.name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = signature
        for key, value in outputs.items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
        limit = self.core.options.max_response_bytes
        if response.ByteSize() > limit:
            message = (
                f"The answer is over this server's limit of {limit} bytes (--max_response_bytes): "
                "send fewer or shorter sentences per request"
            )
            return _abort(context, answered, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        answered(grpc.StatusCode.OK)
        return response

    def GetModelMetadata(self, request, context):  # noqa: N802
        from tensorflow_serving.apis import get_model_metadata_pb2

        answered = _Answered(self.core, "metadata", request.model_spec.name)
        try:
            unsupported = sorted(set(request.metadata_field) - {"signature_def"})
            if not request.metadata_field or unsupported:
                raise ClientError(f"metadata_field must be ['signature_def'], got {list(request.metadata_field)}")
            versions = self.core.models.get(request.model_spec.name)
            servable = _version(versions, request.model_spec)
        except ClientError as error:
            return _abort(context, answered, _code(error), str(error))
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = versions.name
        response.model_spec.version.value = servable.version
        response.metadata["signature_def"].Pack(_signature_def_map(servable.path))
        answered(grpc.StatusCode.OK)
        return response


class _ModelService:
    """``tensorflow.serving.ModelService``: GetModelStatus and HandleReloadConfigRequest."""

    def __init__(self, core: ServingCore):
        self.core = core

    def GetModelStatus(self, request, context):  # noqa: N802
        from tensorflow_serving.apis import get_model_status_pb2

        answered = _Answered(self.core, "status", request.model_spec.name)
        try:
            versions = self.core.models.get(request.model_spec.name)
            spec = request.model_spec
            version = _spec_version(spec)
            if spec.version_label:
                version = str(versions.servable(label=spec.version_label).version)
            rows = versions.status(version)["model_version_status"]
            if not rows:
                raise NotFound(versions.failure())
        except ClientError as error:
            return _abort(context, answered, _code(error), str(error))
        response = get_model_status_pb2.GetModelStatusResponse()
        for row in rows:
            status = response.model_version_status.add()
            status.version = int(row["version"])
            status.state = _STATES[row["state"]]
            if row["status"]["error_message"]:
                status.status.error_code = _ERROR_CODE_UNKNOWN
                status.status.error_message = row["status"]["error_message"]
        answered(grpc.StatusCode.OK)
        return response

    def HandleReloadConfigRequest(self, request, context):  # noqa: N802
        from google.protobuf import text_format
        from tensorflow_serving.apis import model_management_pb2

        answered = _Answered(self.core, "reload_config", "")
        response = model_management_pb2.ReloadConfigResponse()
        try:  # the config as text, so that it is checked as a file is, its errors naming a line of that text
            specs = parse_model_config(text_format.MessageToString(request.config), "ReloadConfigRequest.config")
        except ModelConfigError as error:
            response.status.error_code = _ERROR_CODE_INVALID_ARGUMENT
            response.status.error_message = str(error)
            answered(grpc.StatusCode.INVALID_ARGUMENT)
            return response
        self.core.models.apply(specs, "a ReloadConfigRequest")
        answered(grpc.StatusCode.OK)
        return response


def _servicer(methods: type, base: type) -> type:
    """``methods`` over the generated servicer ``base``, whose other methods answer ``UNIMPLEMENTED``."""
    return type(methods.__name__, (methods, base), {})


def _request_inputs(inputs) -> dict:
    """A request's ``TensorProto``s as the JSON values of REST's columnar format (checked there)."""
    import tensorflow as tf

    values = {}
    for name, proto in inputs.items():
        try:
            array = tf.make_ndarray(proto)
        except Exception as error:  # a dtype numpy lacks, content that does not fill the shape
            raise ClientError(f"input {name!r} is not a valid tensor: {error}") from None
        if array.dtype == object:  # DT_STRING: bytes, which must be UTF-8
            try:
                array = np.vectorize(lambda item: item.decode("utf-8"), otypes=[object])(array)
            except UnicodeDecodeError as error:
                raise ClientError(f"input {name!r} holds a string that is not UTF-8: {error}") from None
        elif array.dtype.kind not in "iuf":
            raise ClientError(f"input {name!r} has dtype {array.dtype}: strings, integers or floats are served")
        values[name] = array.tolist()
    return values


@functools.lru_cache(maxsize=64)
def _signature_def_map(path: str):
    """The export's ``SignatureDef``s as the ``SignatureDefMap`` GetModelMetadata packs."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        model.ParseFromString(handle.read())
    signatures = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in model.meta_graphs[0].signature_def.items():  # all of them, as REST's metadata
        signatures.signature_def[name].CopyFrom(signature)
    return signatures

"""tft-serve's server: the models, and TF Serving's two APIs over them (gRPC on ``--port``, REST on
``--rest_api_port``), started and stopped together."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from configs.serving import ServingOptions
from tf_transformer.serving.core import ServingCore
from tf_transformer.serving.grpc_server import GrpcServer
from tf_transformer.serving.http_server import RestServer
from tf_transformer.serving.models import ModelRegistry
from tf_transformer.serving.versions import ModelVersions


class ModelServer:
    """Both APIs over one :class:`~.core.ServingCore`; bound at once, serving from :meth:`serve_forever`."""

    def __init__(self, models: ModelRegistry, options: ServingOptions):
        self.core = ServingCore(models, options)
        self.models = models
        try:
            self.grpc = GrpcServer(self.core)
            try:
                self.rest = RestServer(self.core)
            except OSError:
                self.grpc.stop(0)
                raise
        except OSError:  # a port taken: nothing is left running
            self.core.release()
            raise
        self.server_address = self.rest.server_address  # REST's (host, port)
        self.grpc_address = self.grpc.server_address

    @property
    def versions(self) -> ModelVersions:
        """The versions of the model served, for a server of one model (``--model``)."""
        [versions] = list(self.models)
        return versions

    @property
    def stopping(self) -> bool:
        return self.core.stopping

    def serve_forever(self, stop_signals: tuple[int, ...] = ()) -> None:
        """Serves both APIs until :meth:`stop` or one of ``stop_signals``; then stops both and returns.

        gRPC calls in flight are given ``rest_api_timeout_in_ms`` to finish, as REST's requests are.
        """
        self.grpc.start()
        try:
            self.rest.serve_forever(stop_signals)
        finally:
            self.grpc.stop(self.core.options.timeout_seconds)  # the REST server has released the core

    def stop(self) -> None:
        """Stops both APIs gracefully (from any thread but :meth:`serve_forever`'s)."""
        self.core.stopping = True
        self.grpc.stop(self.core.options.timeout_seconds)
        self.rest.stop()


def make_server(
    model_path: str | None,
    options: ServingOptions,
    model_name: str | None = None,
    model_config_file: str | None = None,
) -> ModelServer:
    """Binds both APIs, and loads the models' versions in the background.

    The models are the one at ``model_path`` (named ``model_name``, by default
    its base directory's name), or those of ``model_config_file``
    (:mod:`.model_config`). The server answers at once: unavailable on
    readiness and predictions until its models are loaded
    (``server.models.wait_loaded()`` waits). A ``model_path`` holding no model
    at all is a ``FileNotFoundError`` here, a bad config file a
    :class:`~.model_config.ModelConfigError`.
    """
    if (model_path is None) == (model_config_file is None):
        raise ValueError("Serve either one model (a path) or a model config file")
    if model_config_file is not None:
        models = ModelRegistry.from_config_file(model_config_file)
    else:
        models = ModelRegistry.from_path(model_path, model_name)
    server = ModelServer(models, options)
    models.start(options.file_system_poll_wait_seconds, options.model_config_file_poll_wait_seconds)
    return server


def serve_until_signalled(server: ModelServer, on_loaded: Callable[[ModelVersions], None] | None = None) -> None:
    """Serves until SIGTERM or SIGINT, then stops gracefully and returns.

    ``on_loaded(versions)`` is called for each model serving a version once
    every model's first load has ended (unless stopping by then). If no model
    could be loaded, the server stops and a ``FileNotFoundError`` says why.
    Call from the main thread (signals).
    """
    failed = []

    def watch_first_load():
        if server.models.wait_loaded():
            if on_loaded is not None and not server.stopping:
                for versions in server.models:
                    if versions.ready:
                        on_loaded(versions)
        elif not server.stopping:
            failed.append(server.models.failure())
            server.stop()

    threading.Thread(target=watch_first_load, name="first-load", daemon=True).start()
    server.serve_forever(stop_signals=(signal.SIGTERM, signal.SIGINT))
    if failed:
        raise FileNotFoundError(failed[0])

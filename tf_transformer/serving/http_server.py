"""TF Serving's REST API over HTTP/1.1, hardened against what real traffic sends.

  GET  /v1/models/<name>[/versions/<v>]               version status (TF Serving's)
  GET  /v1/models/<name>[/versions/<v>]/metadata      signatures (TF Serving's)
  POST /v1/models/<name>[/versions/<v>]:predict       TF Serving's predict (:mod:`.requests`)
  GET  /healthz                                       200 while the process serves HTTP
  GET  /readyz                                        200 once a version is loaded, 503 before and when stopping

Limits, so that one client cannot take the server down: a request body over
``max_request_bytes`` is answered 413 without being read; a connection idle or
slow for ``timeout_seconds`` is closed; ``num_threads`` threads handle
connections, up to as many more wait for one, and further connections are
answered 503 at once. Every client mistake is a 4xx with a JSON ``{"error": …}``;
a 500 means a fault of the server. :meth:`RestServer.stop` (on SIGTERM) stops
accepting, finishes the requests in flight and returns.
"""

from __future__ import annotations

import concurrent.futures
import http.server
import json
import re
import signal
import socket
import threading

from absl import logging

from tf_transformer.serving.batching import BatchScheduler
from tf_transformer.serving.requests import ClientError, NotFound, Unavailable, parse_json, parse_predict, response
from tf_transformer.serving.versions import ModelVersions

_MODEL_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?:(?P<metadata>/metadata)|(?P<predict>:predict))?$"
)


class RestServer(http.server.HTTPServer):
    """The HTTP server: a bounded pool of handler threads, per-connection timeouts, graceful stop."""

    request_queue_size = 128  # connections the kernel holds before accept

    def __init__(
        self,
        address: tuple[str, int],
        versions: ModelVersions,
        scheduler: BatchScheduler | None,
        max_batch_size: int = 64,
        max_request_bytes: int = 4 << 20,
        timeout_seconds: float = 30.0,
        num_threads: int = 32,
    ):
        self.versions = versions
        self.scheduler = scheduler
        self.max_batch_size = max_batch_size
        self.max_request_bytes = max_request_bytes
        self.stopping = False
        self._pool = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="http")
        self._slots = threading.BoundedSemaphore(2 * num_threads)  # running + waiting connections
        self._refusals = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="refuse")
        self._idle: set[socket.socket] = set()  # connections between requests
        self._idle_lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"timeout": timeout_seconds})
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self._refusals.submit(self._refuse, request)
            return
        self._pool.submit(self._handle, request, client_address)

    def _handle(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except (ConnectionError, TimeoutError, OSError):
            pass  # the client went away or stalled: nothing to answer
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.set_idle(request, False)
            _linger(request)
            self.shutdown_request(request)
            self._slots.release()

    def _refuse(self, connection) -> None:
        """Answers 503 to a connection over the limit, off the thread that accepts."""
        data = json.dumps({"error": "The server is at its connection limit; retry later"}).encode()
        head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        try:
            connection.sendall(head.encode() + b"Connection: close\r\n\r\n" + data)
        except OSError:
            pass
        _linger(connection, seconds=0.1)
        self.shutdown_request(connection)

    def set_idle(self, connection, idle: bool) -> None:
        with self._idle_lock:
            (self._idle.add if idle else self._idle.discard)(connection)

    def stop(self) -> None:
        """Stops accepting, ends idle keep-alive connections, finishes the requests in flight.

        Call from another thread than the one in ``serve_forever``.
        """
        self.stopping = True
        self.shutdown()  # serve_forever returns: no more connections are accepted
        self.server_close()
        with self._idle_lock:
            for connection in self._idle:
                try:
                    connection.shutdown(socket.SHUT_RD)  # its handler sees the end of input and returns
                except OSError:
                    pass
        self._pool.shutdown(wait=True)
        self._refusals.shutdown(wait=True)
        if self.scheduler is not None:
            self.scheduler.stop()
        self.versions.stop()


def _linger(connection, seconds: float = 0.5, most: int = 1 << 20) -> None:
    """Ends our side, then reads what the client still sends for a moment before the socket closes.

    Closing a socket with unread input makes the kernel reset the connection,
    and a reset can destroy our answer before the client reads it: a 413 sent
    without reading the body, for one. Apache's "lingering close" does the same.
    """
    try:
        connection.shutdown(socket.SHUT_WR)
        connection.settimeout(seconds)
        drained = 0
        while drained < most and (chunk := connection.recv(65536)):
            drained += len(chunk)
    except OSError:
        pass


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RestServer

    def handle_one_request(self):
        self.server.set_idle(self.connection, True)
        super().handle_one_request()

    def parse_request(self):
        self.server.set_idle(self.connection, False)
        return super().parse_request()

    def _reply(self, code: int, payload: dict):
        data = json.dumps(payload).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.server.stopping or code >= 500 and code != 503:
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, error: ClientError):
        self._reply(error.status, {"error": str(error)})

    def _body(self) -> bytes | None:
        """The request body, or ``None`` when the client went away before sending all of it."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ClientError("Transfer-Encoding is not supported: send a Content-Length", 411)
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.close_connection = True
            raise ClientError("A request body needs a Content-Length header", 411)
        if not raw.strip().isdigit():
            self.close_connection = True  # where this request ends is unknown
            raise ClientError(f"Content-Length must be a non-negative integer, got {raw[:40]!r}")
        length = int(raw)
        if length > self.server.max_request_bytes:
            self.close_connection = True  # the body is not read
            raise ClientError(
                f"Request body of {length} bytes exceeds the limit of {self.server.max_request_bytes}", 413
            )
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True
            raise ClientError(f"The request body did not arrive within {self.timeout:g} s", 408) from None
        if len(body) < length:
            self.close_connection = True
            return None
        return body

    def do_GET(self):  # noqa: N802 (http.server API)
        server = self.server
        if self.path == "/healthz":
            return self._reply(200, {"status": "serving"})
        if self.path == "/readyz":
            ready = server.versions.ready and not server.stopping
            return self._reply(200 if ready else 503, {"ready": ready, "model": server.versions.name})
        try:
            match = self._route()
            if match["predict"]:
                raise NotFound(f"Predict is a POST: POST /v1/models/{server.versions.name}:predict")
            if match["metadata"]:
                metadata = server.versions.servable(match["version"]).metadata()
                metadata["model_spec"]["name"] = server.versions.name
                return self._reply(200, metadata)
            return self._reply(200, server.versions.status(match["version"]))
        except ClientError as error:
            return self._error(error)

    def do_POST(self):  # noqa: N802
        server = self.server
        try:
            body = self._body()  # read first: a keep-alive connection's next request starts after it
            if body is None:
                return
            match = self._route()
            if not match["predict"]:
                raise NotFound(f"No POST at {self.path}; POST /v1/models/{server.versions.name}:predict")
            servable = server.versions.servable(match["version"])
            request = parse_predict(parse_json(body), servable.input_kinds, server.max_batch_size)
            servable.check(request)
            outputs = self._predict(servable, request)
        except ClientError as error:
            return self._error(error)
        except Exception as error:  # a fault of ours; the server stays up
            if _is_invalid_argument(error):  # the graph refused the input: the client's mistake
                return self._reply(400, {"error": str(error).strip().splitlines()[0]})
            logging.exception("predict failed")
            return self._reply(500, {"error": f"{type(error).__name__}: {error}"})
        return self._reply(200, response(request, outputs))

    def _predict(self, servable, request):
        scheduler = self.server.scheduler
        if scheduler is None:
            return servable.run(request.signature, request.rows)
        if self.server.stopping:
            raise Unavailable("The server is shutting down")
        run = lambda rows: servable.run(request.signature, rows)  # noqa: E731
        return scheduler.submit((servable, request.signature), run, request.rows).result()

    def _route(self):
        match = _MODEL_PATH.match(self.path.split("?", 1)[0])
        name = self.server.versions.name
        if not match:
            raise NotFound(f"No resource at {self.path}; this server serves /v1/models/{name}")
        if match["name"] != name:
            raise NotFound(f"No model named {match['name']!r}; this server serves {name!r}")
        return match

    def log_message(self, format, *args):  # noqa: A002 (quiet: one line per request is too much at load)
        pass


def _is_invalid_argument(error: Exception) -> bool:
    import tensorflow as tf

    return isinstance(error, tf.errors.InvalidArgumentError)


def make_server(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 8501,
    model_name: str | None = None,
    max_batch_size: int = 64,
    enable_batching: bool = True,
    batch_timeout_micros: int = 1000,
    num_batch_threads: int = 1,
    max_enqueued_batches: int = 16,
    max_request_bytes: int = 4 << 20,
    timeout_seconds: float = 30.0,
    num_threads: int = 32,
    poll_seconds: float = 1.0,
) -> RestServer:
    """Loads the model's newest version and binds; :meth:`RestServer.serve_forever` serves."""
    versions = ModelVersions(model_path, model_name)
    versions.start(poll_seconds)
    scheduler = None
    if enable_batching:
        scheduler = BatchScheduler(max_batch_size, batch_timeout_micros, num_batch_threads, max_enqueued_batches)
    return RestServer(
        (host, port), versions, scheduler, max_batch_size, max_request_bytes, timeout_seconds, num_threads
    )


def serve_until_signalled(server: RestServer) -> None:
    """Serves until SIGTERM or SIGINT, then stops gracefully (:meth:`RestServer.stop`) and returns."""
    stopper = threading.Thread(target=server.stop, name="stop")

    def on_signal(signum, frame):
        if not stopper.is_alive() and not server.stopping:
            logging.info("Signal %d: finishing the requests in flight", signum)
            stopper.start()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.serve_forever()
    finally:
        if stopper.is_alive() or server.stopping:
            stopper.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""TF Serving's REST API over HTTP/1.1, hardened against what real traffic sends.

  GET  /v1/models/<name>[/versions/<v>]               version status (TF Serving's)
  GET  /v1/models/<name>[/versions/<v>]/metadata      signatures (TF Serving's)
  POST /v1/models/<name>[/versions/<v>]:predict       TF Serving's predict (:mod:`.requests`)
  GET  /healthz                                       200 while the process serves HTTP
  GET  /readyz                                        200 once a version is loaded, 503 before and when stopping

The server answers from the moment it binds: the model loads in the background
(:func:`make_server`), and until a version is available the status answer
reports it ``LOADING``, readiness and predictions answer 503.

Limits, so that one client cannot take the server down: a request body over
``max_request_bytes`` is answered 413 without being read, and an answer over
``max_response_bytes`` 413 instead of the answer; a connection idle or slow for
``timeout_seconds`` is closed, and an answer not written within
``timeout_seconds`` (a client that does not read it) is given up;
``num_threads`` threads handle connections, up to as many more wait for one, and
further connections are answered 503 at once. Every client mistake is a 4xx
with a JSON ``{"error": …}``; a 500 means a fault of the server.
:meth:`RestServer.stop` (on SIGTERM) stops accepting, finishes the requests in
flight, answers every other connection it accepted and returns.
"""

from __future__ import annotations

import concurrent.futures
import http
import http.server
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable

from absl import logging

from tf_transformer.exporting.export_info import graph_error
from tf_transformer.serving.batching import BatchScheduler
from tf_transformer.serving.requests import (
    ClientError,
    NotFound,
    Unavailable,
    encode_response,
    parse_json,
    parse_predict,
)
from tf_transformer.serving.versions import ModelVersions

_MODEL_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[0-9]{1,18}))?"
    r"(?:(?P<metadata>/metadata)|(?P<predict>:predict))?$"
)
_LENGTH = re.compile(r"[0-9]{1,15}")
STOP_GRACE_SECONDS = 1.0  # once stopping, how long a connection without a request yet has to send one


class RestServer(http.server.HTTPServer):
    """The HTTP server: a bounded pool of handler threads, deadlines per connection, graceful stop.

    Each connection is in one of four phases: ``waiting`` for a request (a new
    or a kept-alive connection), ``reading`` one (its line, headers and body),
    ``working`` on it or ``writing`` its answer. A watchdog closes connections
    that wait, take to send a request, or take to read their answer, longer than
    ``timeout_seconds``: a per-read timeout alone lets a client that sends a
    byte now and then hold a thread forever, and one that reads a byte now and
    then would hold it as long. While connections queue for a thread, answers
    close their connection instead of keeping it alive, so idle clients do not
    hold the threads.
    """

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
        max_response_bytes: int = 8 << 20,
    ):
        self.versions = versions
        self.scheduler = scheduler
        self.max_batch_size = max_batch_size
        self.max_request_bytes = max_request_bytes
        self.max_response_bytes = max_response_bytes
        self.timeout_seconds = timeout_seconds
        self.stopping = False
        self._pool = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="http")
        self._slots = threading.BoundedSemaphore(2 * num_threads)  # running + waiting connections
        self._refusals = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="refuse")
        self._refusing = 0
        self._queued = 0  # connections accepted and not yet given a thread
        self._phases: dict[socket.socket, tuple[str, float]] = {}
        self.expired: set[socket.socket] = set()  # closed by the watchdog while reading
        self._lock = threading.Lock()
        self._watchdog_stop = threading.Event()
        handler = type("Handler", (_Handler,), {"timeout": timeout_seconds})
        super().__init__(address, handler)
        self._watchdog = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._watchdog.start()

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            with self._lock:
                refuse = self._refusing < 64
                self._refusing += refuse
            if refuse:
                self._refusals.submit(self._refuse, request)
            elif self.stopping:  # stop() taking the backlog: answer each here, on the stopping thread, not drop it
                with self._lock:
                    self._refusing += 1
                self._refuse(request)
            else:  # a flood: drop it without an answer rather than queue without bound
                self.shutdown_request(request)
            return
        with self._lock:
            self._queued += 1
        self._pool.submit(self._handle, request, client_address)

    @property
    def busy(self) -> bool:
        """Connections are waiting for a handler thread."""
        return self._queued > 0

    def _handle(self, request, client_address):
        with self._lock:
            self._queued -= 1
        try:
            self.finish_request(request, client_address)
        except (ConnectionError, TimeoutError, OSError):
            pass  # the client went away or stalled: nothing to answer
        except Exception:
            self.handle_error(request, client_address)
        finally:
            with self._lock:
                self._phases.pop(request, None)
                self.expired.discard(request)
            _linger(request)
            self.shutdown_request(request)
            self._slots.release()

    def _refuse(self, connection) -> None:
        """Answers 503 to a connection over the limit, off the thread that accepts."""
        why = "The server is stopping; retry" if self.stopping else "The server is at its connection limit; retry later"
        data = json.dumps({"error": why}).encode()
        head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        try:
            connection.settimeout(1.0)
            connection.sendall(head.encode() + b"Connection: close\r\n\r\n" + data)
        except OSError:
            pass
        _linger(connection, seconds=0.1)
        self.shutdown_request(connection)
        with self._lock:
            self._refusing -= 1

    def set_phase(self, connection, phase: str) -> None:
        with self._lock:
            self._phases[connection] = (phase, time.monotonic())

    def _watch(self) -> None:
        while not self._watchdog_stop.wait(min(0.5, self.timeout_seconds / 4)):
            now = time.monotonic()
            with self._lock:
                late = [
                    (connection, phase)
                    for connection, (phase, since) in self._phases.items()
                    # a slow body gets a moment more, so that its own read timeout can answer 408; an answer's
                    # writes have their own deadline (_Handler._write), this is the backstop
                    if phase != "working" and now - since > self.timeout_seconds + (phase != "waiting")
                ]
                self.expired.update(connection for connection, phase in late if phase == "reading")
            for connection, phase in late:
                try:  # its handler reads the end of input and closes; a write fails at once
                    connection.shutdown(socket.SHUT_RDWR if phase == "writing" else socket.SHUT_RD)
                except OSError:
                    pass

    def stop(self) -> None:
        """Stops accepting, ends waiting keep-alive connections, finishes the requests in flight.

        Every connection accepted is answered, none closed unanswered: the
        requests in flight (decoding, or waiting in a batch) are finished; a
        request read after the stop began, on a connection waiting for a thread
        or one the kernel had accepted and the server not yet taken, is answered
        503 (a predict) or as usual (the others), then its connection closed.
        A kept-alive connection waiting for its next request is closed at once,
        one not yet handled once ``STOP_GRACE_SECONDS`` pass without a request.
        Call from another thread than the one in ``serve_forever``.
        """
        self.stopping = True
        self.shutdown()  # serve_forever returns: no more connections are accepted
        self._take_backlog()
        self.server_close()
        with self._lock:
            waiting = [connection for connection, (phase, _) in self._phases.items() if phase == "waiting"]
        for connection in waiting:
            try:
                connection.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        self._pool.shutdown(wait=True)
        self._refusals.shutdown(wait=True)
        self._watchdog_stop.set()
        self._watchdog.join()
        if self.scheduler is not None:
            self.scheduler.stop()
        self.versions.stop()

    def _take_backlog(self) -> None:
        """Takes the connections the kernel has accepted and the server not yet: closing the socket would reset them."""
        self.socket.setblocking(False)
        while True:
            try:
                connection, address = self.socket.accept()
            except OSError:  # none left (BlockingIOError), or the socket is gone
                return
            connection.setblocking(True)
            self.process_request(connection, address)


def _linger(connection, seconds: float = 0.5, most: int = 1 << 20) -> None:
    """Ends our side, then reads what the client still sends for a moment before the socket closes.

    Closing a socket with unread input makes the kernel reset the connection,
    and a reset can destroy our answer before the client reads it: a 413 sent
    without reading the body, for one. Apache's "lingering close" does the same.
    At most ``seconds`` in all.
    """
    deadline = time.monotonic() + seconds
    try:
        connection.shutdown(socket.SHUT_WR)
        drained = 0
        while drained < most and (left := deadline - time.monotonic()) > 0:
            connection.settimeout(left)
            if not (chunk := connection.recv(65536)):
                break
            drained += len(chunk)
    except OSError:
        pass


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RestServer

    def handle_one_request(self):
        if self.server.stopping:  # accepted before the stop: a request already sent is read and answered
            self.connection.settimeout(min(self.timeout, STOP_GRACE_SECONDS))
        self.server.set_phase(self.connection, "waiting")
        super().handle_one_request()

    def parse_request(self):
        self.server.set_phase(self.connection, "reading")
        self.connection.settimeout(self.timeout)
        return super().parse_request()

    def handle_expect_100(self):
        """Refuses an oversize or unreadable body before the client sends it (curl asks for large uploads)."""
        try:
            self._body_length()
        except ClientError as error:
            self._error(error)
            return False
        return super().handle_expect_100()

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (a malformed request line, an unknown method) as JSON too."""
        self.close_connection = True
        try:
            self._reply(code, {"error": message or explain or http.HTTPStatus(code).phrase})
        except OSError:
            pass

    def _reply(self, code: int, payload: dict | bytes):
        """Answers ``payload`` (JSON, or its encoding) within the deadline (:meth:`_write`)."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.server.stopping or self.server.busy or (code >= 500 and code != 503):
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self._headers_buffer.append(b"\r\n")
        head = b"".join(self._headers_buffer)
        self._headers_buffer = []
        self._write(head, data)

    def _write(self, *parts: bytes) -> None:
        """Sends ``parts`` within one deadline of ``timeout_seconds`` for them all, or raises ``TimeoutError``.

        A per-send timeout would let a client that reads a little now and then hold the thread as long as it likes.
        """
        self.server.set_phase(self.connection, "writing")
        deadline = time.monotonic() + self.timeout
        for part in parts:
            view = memoryview(part)
            while view:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close_connection = True
                    raise TimeoutError(f"The answer was not read within {self.timeout:g} s")
                self.connection.settimeout(left)
                view = view[self.connection.send(view) :]
        self.connection.settimeout(self.timeout)
        self.server.set_phase(self.connection, "working")

    def _error(self, error: ClientError):
        self._reply(error.status, {"error": str(error)})

    def _body_length(self) -> int:
        """The announced body length, checked: a :class:`ClientError` (and no keep-alive) when it cannot be read."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ClientError("Transfer-Encoding is not supported: send a Content-Length", 411)
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.close_connection = True
            raise ClientError("A request body needs a Content-Length header", 411)
        if not _LENGTH.fullmatch(raw.strip()):
            self.close_connection = True  # where this request ends is unknown
            raise ClientError(f"Content-Length must be a non-negative integer, got {raw[:40]!r}")
        length = int(raw)
        if length > self.server.max_request_bytes:
            self.close_connection = True  # the body is not read
            raise ClientError(
                f"Request body of {length} bytes exceeds the limit of {self.server.max_request_bytes}", 413
            )
        return length

    def _body(self) -> bytes | None:
        """The request body, or ``None`` when the client went away before sending all of it."""
        length = self._body_length()
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            body = None
        if body is None or len(body) < length:
            self.close_connection = True
            if body is None or self.connection in self.server.expired:
                raise ClientError(f"The request did not arrive within {self.server.timeout_seconds:g} s", 408)
            return None  # the client went away
        self.server.set_phase(self.connection, "working")
        return body

    def do_GET(self):  # noqa: N802 (http.server API)
        server = self.server
        try:
            if self.headers.get("Content-Length", "0").strip() not in ("", "0") or self.headers.get(
                "Transfer-Encoding"
            ):
                self.close_connection = True  # a body on a GET: do not read what follows as a request
            server.set_phase(self.connection, "working")
            if self.path == "/healthz":
                return self._reply(200, {"status": "serving"})
            if self.path == "/readyz":
                if server.versions.ready and not server.stopping:
                    return self._reply(200, {"ready": True, "model": server.versions.name})
                error = "The server is stopping" if server.stopping else server.versions.failure()
                return self._reply(503, {"ready": False, "model": server.versions.name, "error": error})
            match = self._route()
            if match["predict"]:
                raise NotFound(f"Predict is a POST: POST /v1/models/{server.versions.name}:predict")
            if match["metadata"]:
                metadata = server.versions.servable(match["version"]).metadata()
                metadata["model_spec"] = {"name": server.versions.name, **metadata["model_spec"]}
                return self._reply(200, metadata)
            return self._reply(200, server.versions.status(match["version"]))
        except ClientError as error:
            return self._error(error)
        except OSError:
            raise  # the connection: nothing to answer on
        except Exception as error:  # a fault of ours; the server stays up
            logging.exception("GET %s failed", self.path)
            return self._reply(500, {"error": f"{type(error).__name__}: {error}"})

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
            answer = encode_response(request, outputs, server.max_response_bytes)
        except ClientError as error:
            return self._error(error)
        except OSError:
            raise
        except Exception as error:  # a fault of ours; the server stays up
            if _is_invalid_argument(error):  # the graph refused the input: the client's mistake
                return self._reply(400, {"error": graph_error(error)})
            logging.exception("predict failed")
            return self._reply(500, {"error": f"{type(error).__name__}: {error}"})
        return self._reply(200, answer)

    def _predict(self, servable, request):
        scheduler = self.server.scheduler
        if self.server.stopping:  # a request read after the stop began: retry on another replica, or later
            raise Unavailable("The server is stopping; retry")
        if request.columns or request.scalars:
            # A request with its own settings runs alone (its own key: never merged), queued with the rest.
            run = lambda rows: servable.run(request.signature, rows, request.columns, request.scalars)  # noqa: E731
            if scheduler is None:
                return run(request.rows)
            return scheduler.submit((servable, request.signature, object()), run, request.rows).result()
        if scheduler is None:
            return servable.run(request.signature, request.rows)
        run = lambda rows: servable.run(request.signature, rows)  # noqa: E731
        fit = lambda outputs: servable.fit(request.signature, request.rows, outputs)  # noqa: E731
        return scheduler.submit((servable, request.signature), run, request.rows, fit).result()

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
    num_batch_threads: int = 2,
    max_enqueued_batches: int = 16,
    max_request_bytes: int = 4 << 20,
    timeout_seconds: float = 30.0,
    num_threads: int = 32,
    poll_seconds: float = 1.0,
    max_response_bytes: int = 8 << 20,
) -> RestServer:
    """Binds, and loads the model's newest version in the background; :meth:`RestServer.serve_forever` serves.

    The server answers at once, 503 on readiness and predictions until a version
    is loaded (``server.versions.wait_loaded()`` waits for it). A path holding no
    model at all is a ``FileNotFoundError`` here.
    """
    versions = ModelVersions(model_path, model_name)
    scheduler = None
    if enable_batching:
        scheduler = BatchScheduler(max_batch_size, batch_timeout_micros, num_batch_threads, max_enqueued_batches)
    try:
        server = RestServer(
            (host, port),
            versions,
            scheduler,
            max_batch_size,
            max_request_bytes,
            timeout_seconds,
            num_threads,
            max_response_bytes,
        )
    except BaseException:
        if scheduler is not None:
            scheduler.stop()
        raise
    versions.start(poll_seconds, wait=False)
    return server


def serve_until_signalled(server: RestServer, on_loaded: Callable[[int], None] | None = None) -> None:
    """Serves until SIGTERM or SIGINT, then stops gracefully (:meth:`RestServer.stop`) and returns.

    ``on_loaded(version)`` is called once the first version is available (unless
    stopping by then). If the first load fails, the server stops and a
    ``FileNotFoundError`` says why. A signal during the first load lets it finish.
    """
    stopper = threading.Thread(target=server.stop, name="stop")
    failed = []

    def watch_first_load():
        if server.versions.wait_loaded():
            if on_loaded is not None and not server.stopping:
                on_loaded(server.versions.servable().version)
        elif not server.stopping:
            failed.append(server.versions.failure())
            start_stopping()

    def start_stopping():
        with lock:
            if not stopper.is_alive() and not server.stopping:
                stopper.start()

    def on_signal(signum, frame):
        logging.info("Signal %d: finishing the requests in flight", signum)
        start_stopping()

    lock = threading.Lock()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    threading.Thread(target=watch_first_load, name="first-load", daemon=True).start()
    try:
        server.serve_forever()
    finally:
        if stopper.is_alive() or server.stopping:
            stopper.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise FileNotFoundError(failed[0])

"""TF Serving's REST API on aiohttp's HTTP/1.1 server, with the limits real traffic needs.

  GET  /v1/models/<name>[/versions/<v>]               version status (TF Serving's)
  GET  /v1/models/<name>[/versions/<v>]/metadata      signatures (TF Serving's)
  POST /v1/models/<name>[/versions/<v>]:predict       TF Serving's predict (:mod:`.rest_api`)
  GET  /monitoring/prometheus/metrics                 Prometheus metrics (TF Serving's path, :mod:`.metrics`)
  GET  /healthz                                       200 while the process serves HTTP
  GET  /readyz                                        200 once a version is loaded, 503 before and when stopping

aiohttp parses HTTP/1.1 (keep-alive, pipelining, chunked bodies) and runs
every connection on one event loop, so an idle connection costs a socket and no
thread. What stays ours is the API, the versions manager and the request
batching; JSON over ``INLINE_BYTES`` and decoding without batching run on a pool
of ``num_threads`` threads, so the loop never waits for them long (smaller JSON
is handled on the loop: a thread hop costs more). docs/serving.md says why
aiohttp and what is added here.

Limits, so that one client cannot take the server down: a request body over
``max_request_bytes`` is answered 413 without being read (chunked: once it
passes the limit), and an answer over ``max_response_bytes`` 413 instead of the
answer; a request (line, headers and body) must arrive within
``timeout_seconds`` of its first byte, an idle connection is closed after
``timeout_seconds``, and an answer not written within ``timeout_seconds`` (a
client that does not read it) is given up and its connection dropped; beyond
``max_connections`` open connections a new one is answered 503 at once. Every
client mistake is a 4xx with a JSON ``{"error": …}``; a 500 means a fault of the
server. :meth:`RestServer.stop` (on SIGTERM) stops accepting, finishes the
requests in flight, answers every other connection it accepted and returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable

from absl import logging
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from tf_transformer.exporting.export_info import graph_error
from tf_transformer.serving import metrics as metrics_lib
from tf_transformer.serving.batching import BatchScheduler
from tf_transformer.serving.rest_api import (
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
STOP_GRACE_SECONDS = 1.0  # once stopping, how long a connection without a request yet has to send one
LINGER_SECONDS = 0.5  # after an answer that closes the connection, how long what the client still sends is read
MAX_REFUSING = 64  # 503s being written at once; beyond, a connection over the limit is closed unanswered
_HANDLED = web.RequestKey("handled", bool)  # a request handle() answered (and counted)
INLINE_BYTES = 64 << 10  # JSON up to this size is parsed or encoded on the event loop: a thread hop costs more


class RestServer:
    """The HTTP server: binds at once; :meth:`serve_forever` runs its event loop, :meth:`stop` ends it gracefully.

    Each connection is a :class:`_Connection` (aiohttp's protocol, with the
    deadlines added). The accept loop is ours, so that the server can stop
    accepting without closing its socket (:meth:`shutdown`) and then answer the
    connections the kernel had already accepted (:meth:`stop`), and so that a
    connection over ``max_connections`` is answered 503 without a protocol.
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
        max_connections: int = 4096,
    ):
        self.versions = versions
        self.scheduler = scheduler
        self.max_batch_size = max_batch_size
        self.max_request_bytes = max_request_bytes
        self.max_response_bytes = max_response_bytes
        self.timeout_seconds = timeout_seconds
        self.max_connections = max_connections
        self.metrics = metrics_lib.ServingMetrics(versions)
        if scheduler is not None and scheduler.observe is None:
            scheduler.observe = self.metrics.batch
        self.stopping = False
        self.socket = socket.create_server(address, backlog=self.request_queue_size)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()[:2]
        self._pool = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="http")
        self._loop = asyncio.new_event_loop()
        self._http = _HttpServer(self)
        self._connections: set[_Connection] = set()
        self._refusing = 0
        self._adopting = 0  # connections accepted and not yet given their protocol
        self._in_flight = 0  # requests being handled
        self._accepting: asyncio.Task | None = None
        self._finished = self._loop.create_future()  # set once a stop has drained the connections
        self._state = threading.Lock()
        self._serving = False
        self._served = threading.Event()  # serve_forever has returned

    # Serving and stopping.

    def serve_forever(self) -> None:
        """Accepts and answers connections until :meth:`stop` has ended; returns at once if stopped before."""
        with self._state:
            if self.stopping:
                return
            self._serving = True
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            pending = [task for task in asyncio.all_tasks(self._loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()
            asyncio.set_event_loop(None)
            self._served.set()

    async def _serve(self) -> None:
        if not self.stopping:
            self._accepting = asyncio.ensure_future(self._accept())
        await self._finished

    async def _accept(self) -> None:
        while True:
            try:
                connection, _ = await self._loop.sock_accept(self.socket)
            except OSError as error:  # out of file descriptors, say: wait rather than spin
                logging.log_every_n_seconds(logging.WARNING, "accept: %s", 10, error)
                await asyncio.sleep(0.1)
                continue
            self._adopting += 1
            self._loop.create_task(self._adopt(connection))  # while the next one is accepted

    async def _adopt(self, connection: socket.socket) -> None:
        """Makes ``connection`` ours (counted in ``_adopting`` by the caller until it is)."""
        try:
            if len(self._connections) + self._adopting <= self.max_connections:
                protocol = self._http()
            elif self._refusing < MAX_REFUSING or self.stopping:  # a stop answers every connection it takes
                self.metrics.refused.labels(self.metrics.model).inc()
                self._refusing += 1  # now: the accept loop may start several before the first connects
                protocol = _Refusal(self)
            else:  # a flood: drop it without an answer rather than hold sockets without bound
                self.metrics.refused.labels(self.metrics.model).inc()
                connection.close()
                return
            try:
                await self._loop.connect_accepted_socket(lambda: protocol, connection)
            except OSError:
                connection.close()
                if isinstance(protocol, _Refusal):
                    self._refusing -= 1
        finally:
            self._adopting -= 1

    def shutdown(self) -> None:
        """Stops accepting; what the kernel accepts from now on waits in its backlog for :meth:`stop`."""
        if self._serving and not self._served.is_set():
            asyncio.run_coroutine_threadsafe(self._stop_accepting(), self._loop).result()

    async def _stop_accepting(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting

    def stop(self) -> None:
        """Stops accepting, ends waiting keep-alive connections, finishes the requests in flight.

        Every connection accepted is answered, none closed unanswered: the
        requests in flight (decoding, or waiting in a batch) are finished; a
        request read after the stop began, on a connection the kernel had
        accepted and the server not yet taken, is answered 503 (a predict) or as
        usual (the others), then its connection closed. A kept-alive connection
        waiting for its next request is closed at once, one that has not sent a
        request yet once ``STOP_GRACE_SECONDS`` pass without one. Call from
        another thread than the one in :meth:`serve_forever`.
        """
        with self._state:
            self.stopping = True
            serving = self._serving
        if serving and not self._served.is_set():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                asyncio.run_coroutine_threadsafe(self._drain(), self._loop).result()
            self._served.wait()
        else:
            self.socket.close()
        self._pool.shutdown(wait=True)
        if self.scheduler is not None:
            self.scheduler.stop()
        self.versions.stop()

    async def _drain(self) -> None:
        await self._stop_accepting()
        while True:  # the connections the kernel accepted and we did not: closing the socket would reset them
            try:
                connection, _ = self.socket.accept()
            except OSError:  # none left (BlockingIOError), or the socket is gone
                break
            self._adopting += 1
            await self._adopt(connection)
        self.socket.close()
        for connection in list(self._connections):
            connection.end_when_idle()
        while self._connections or self._in_flight or self._refusing or self._adopting:
            await asyncio.sleep(0.02)
        self._finished.set_result(None)

    # Requests.

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answers one request: routes it, answers in JSON within the deadline, counts it."""
        connection: _Connection = request.protocol
        started = time.perf_counter()
        labels = {"api": "other", "signature": ""}
        self._in_flight += 1
        connection.begin_request()
        status = 500
        try:
            try:
                status, payload = await self._answer(request, connection, labels)
            except ClientError as error:
                status, payload = error.status, {"error": str(error)}
            except Exception as error:  # a fault of ours; the server stays up
                if _is_invalid_argument(error):  # the graph refused the input: the client's mistake
                    status, payload = 400, {"error": graph_error(error)}
                else:
                    logging.exception("%s %s failed", request.method, request.raw_path)
                    status, payload = 500, {"error": f"{type(error).__name__}: {error}"}
            if isinstance(payload, web.StreamResponse):
                response = payload
            else:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
                response = web.Response(status=status, body=data, content_type="application/json")
            if self.stopping or connection.must_close or (status >= 500 and status != 503):
                response.force_close()
            if await connection.send(request, response) and self.stopping and response.keep_alive:
                connection.close()  # the stop began while it was written: no next request
            return response
        finally:
            request[_HANDLED] = True  # counted here, not again by handle_error
            if connection.delivered:
                self.metrics.answered(labels["api"], labels["signature"], status, time.perf_counter() - started)
            connection.handling = False
            connection.must_close = False
            self._in_flight -= 1

    async def _answer(self, request: web.BaseRequest, connection: _Connection, labels: dict):
        """``(status, JSON payload, its encoding, or a whole response)`` for ``request``."""
        path = request.raw_path.split("?", 1)[0]
        if request.method not in ("GET", "POST"):
            connection.must_close = True  # a body, if any, is not read
            raise ClientError(f"Unsupported method {request.method!r}: GET or POST", 501)
        if request.method == "POST":
            return await self._post(request, connection, path, labels)
        if path in ("/healthz", "/readyz"):
            labels["api"] = path[1:]
            if path == "/healthz":
                return 200, {"status": "serving"}
            if self.versions.ready and not self.stopping:
                return 200, {"ready": True, "model": self.versions.name}
            error = "The server is stopping" if self.stopping else self.versions.failure()
            return 503, {"ready": False, "model": self.versions.name, "error": error}
        if path == metrics_lib.PATH:
            labels["api"] = "metrics"
            body, content_type = self.metrics.exposition()
            return 200, web.Response(body=body, headers={"Content-Type": content_type})
        match = self._route(request.raw_path)
        if match["predict"]:
            raise NotFound(f"Predict is a POST: POST /v1/models/{self.versions.name}:predict")
        if match["metadata"]:
            labels["api"] = "metadata"
            metadata = self.versions.servable(match["version"]).metadata()
            metadata["model_spec"] = {"name": self.versions.name, **metadata["model_spec"]}
            return 200, metadata
        labels["api"] = "status"
        return 200, self.versions.status(match["version"])

    async def _post(self, request: web.BaseRequest, connection: _Connection, path: str, labels: dict):
        found = _MODEL_PATH.match(path)
        if found and found["predict"]:
            labels["api"] = "predict"  # a 413, 408 or 411 on its body counts as one of predict's
        body = await connection.read_body(request)  # first: a keep-alive connection's next request starts after it
        match = self._model_match(found, request.raw_path)  # routing errors only once the body is read
        if not match["predict"]:
            raise NotFound(f"No POST at {request.raw_path}; POST /v1/models/{self.versions.name}:predict")
        servable = self.versions.servable(match["version"])

        def parse():
            parsed = parse_predict(parse_json(body), servable.input_kinds, self.max_batch_size)
            servable.check(parsed)
            return parsed

        predict = parse() if len(body) <= INLINE_BYTES else await self._in_pool(parse)
        labels["signature"] = predict.signature
        outputs = await self._predict(servable, predict)
        if sum(_size(value) for value in outputs.values()) <= INLINE_BYTES:
            return 200, encode_response(predict, outputs, self.max_response_bytes)
        return 200, await self._in_pool(encode_response, predict, outputs, self.max_response_bytes)

    async def _predict(self, servable, request):
        if self.stopping:  # a request read after the stop began: retry on another replica, or later
            raise Unavailable("The server is stopping; retry")
        scheduler = self.scheduler
        signature = request.signature
        if request.columns or request.scalars:
            # A request with its own settings runs alone (its own key: never merged), queued with the rest.
            run = lambda rows: servable.run(signature, rows, request.columns, request.scalars)  # noqa: E731
            key, fit = (servable, signature, object()), None
        else:
            run = lambda rows: servable.run(signature, rows)  # noqa: E731
            key, fit = (servable, signature), lambda outputs: servable.fit(signature, request.rows, outputs)
        if scheduler is None:
            self.metrics.batch(len(request.rows), [0.0])
            return await self._in_pool(run, request.rows)
        return await asyncio.wrap_future(scheduler.submit(key, run, request.rows, fit))

    async def _in_pool(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    def _route(self, raw_path: str):
        return self._model_match(_MODEL_PATH.match(raw_path.split("?", 1)[0]), raw_path)

    def _model_match(self, match: re.Match | None, raw_path: str) -> re.Match:
        """``match``, the path's match of ``_MODEL_PATH``, if it names the model served; else 404."""
        name = self.versions.name
        if not match:
            raise NotFound(f"No resource at {raw_path}; this server serves /v1/models/{name}")
        if match["name"] != name:
            raise NotFound(f"No model named {match['name']!r}; this server serves {name!r}")
        return match


class _HttpServer(web.Server):
    """aiohttp's low-level server, making our :class:`_Connection` for each connection."""

    def __init__(self, rest: RestServer):
        super().__init__(
            rest.handle,
            loop=rest._loop,
            keepalive_timeout=rest.timeout_seconds,
            lingering_time=LINGER_SECONDS,
            access_log=None,  # one line per request is too much at load; the metrics count them
        )
        self.rest = rest

    def __call__(self) -> _Connection:
        return _Connection(self, loop=self._loop, **self._kwargs)


class _Connection(web.RequestHandler):
    """One client connection: aiohttp's protocol, plus a deadline on reading each request and writing its answer.

    aiohttp closes a connection that waits for a request longer than its
    keep-alive timeout, counted from the last answer, but bounds neither a body's
    arrival nor an answer's writing: a client that sends its body, or reads its
    answer, a byte now and then would hold its connection and its handler for as
    long as it likes. Here each request must arrive within ``timeout_seconds`` of
    its first byte (:meth:`read_body` answers 408 if its body does not), and
    each answer be written within ``timeout_seconds`` (:meth:`send`,
    :meth:`finish_response`), or the connection is dropped.
    """

    def __init__(self, manager: _HttpServer, **kwargs):
        super().__init__(manager, **kwargs)
        self.rest = manager.rest
        self.deadline: float | None = None  # loop time by which the request being read must have arrived
        self.request_deadline = 0.0  # the deadline of the request being handled (its body's)
        self.first_byte: float | None = None  # when the request being read began to arrive
        self.delivered = False  # the last answer was written whole
        self._expiry: asyncio.TimerHandle | None = None
        self.handling = False  # a request is being handled
        self.must_close = False  # its body was not read to the end: the connection cannot be reused
        self.answered = 0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # Writes wait until the kernel has taken every byte, so that the answer's deadline (send) covers it all:
        # a few kilobytes left in our buffer would otherwise keep a closed connection open for as long as the
        # client does not read (asyncio's close waits for the buffer to empty).
        transport.set_write_buffer_limits(high=0)
        self.rest._connections.add(self)
        self.rest.metrics.connections.labels(self.rest.metrics.model).inc()
        if self.rest.stopping:  # taken from the backlog during a stop: a moment to send its request
            self._arm(STOP_GRACE_SECONDS)

    def connection_lost(self, exc) -> None:
        if self in self.rest._connections:
            self.rest._connections.discard(self)
            self.rest.metrics.connections.labels(self.rest.metrics.model).dec()
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and self._expiry is None and self.transport is not None:
            self.first_byte = self._loop.time()
            self._arm(self.rest.timeout_seconds)  # a request's first byte: it has until the deadline
        super().data_received(data)

    def begin_request(self) -> None:
        """Its headers are in: the deadline passes to its body (:meth:`read_body`); a next request's first
        byte starts its own."""
        self.handling = True
        began = self.first_byte if self.first_byte is not None else self._loop.time()
        self.request_deadline = began + self.rest.timeout_seconds  # not a stop's grace: the body gets its time
        self.first_byte = None
        self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self.deadline = self._loop.time() + min(seconds, self.rest.timeout_seconds)
        self._expiry = self._loop.call_at(self.deadline, self._expire)

    def _disarm(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry, self.deadline = None, None

    def _expire(self) -> None:
        self._expiry = None
        if self.handling:  # a pipelined next request waits its turn, its deadline with it
            self._arm(self.rest.timeout_seconds)
            return
        self.deadline = None
        self.force_close()  # its line and headers did not arrive in time (or nothing did, while stopping)

    def end_when_idle(self) -> None:
        """On stop: closes the connection if it waits for a next request; one that has sent none yet gets a moment."""
        if self.handling or self._messages:
            return  # answered, then closed (handle closes it after its answer)
        if self._expiry is not None or not self.answered:  # a request under way, or none sent yet
            if self.deadline is None or self.deadline > self._loop.time() + STOP_GRACE_SECONDS:
                self._arm(STOP_GRACE_SECONDS)
            return
        self.force_close()

    async def read_body(self, request: web.BaseRequest) -> bytes:
        """The request body, checked against ``max_request_bytes`` and read by the request's deadline."""
        limit = self.rest.max_request_bytes
        length = request.content_length
        if length is None and "chunked" not in request.headers.get("Transfer-Encoding", "").lower():
            raise ClientError("A request body needs a Content-Length header or chunked Transfer-Encoding", 411)
        if length is not None and length > limit:
            self.must_close = True  # the body is not read
            raise ClientError(f"Request body of {length} bytes exceeds the limit of {limit}", 413)
        chunks, size = [], 0
        try:
            if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                request.writer.output_size = 0  # the answer proper is still to come
            async with asyncio.timeout_at(self.request_deadline):
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > limit:
                        self.must_close = True
                        raise ClientError(f"Request body exceeds the limit of {limit} bytes", 413)
                    chunks.append(chunk)
        except TimeoutError:
            self.must_close = True
            raise ClientError(f"The request did not arrive within {self.rest.timeout_seconds:g} s", 408) from None
        except RequestPayloadError as error:  # a malformed chunked body, or one cut short
            self.must_close = True
            raise ClientError(f"Malformed request body: {error}") from None
        except ConnectionError:  # the client went away: nobody to answer, nothing to log
            self.must_close = True
            raise ClientError("The connection closed before the whole body arrived") from None
        self._disarm()  # armed by the body's own bytes, not a next request's
        return b"".join(chunks)

    async def send(self, request: web.BaseRequest, response: web.StreamResponse) -> bool:
        """Writes ``response`` within ``timeout_seconds``, or drops the connection; whether it was written."""
        transport = self.transport
        self.delivered = False
        try:
            async with asyncio.timeout(self.rest.timeout_seconds):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            if transport is not None:
                transport.abort()  # its unread answer goes with it
            return False
        except ConnectionError:
            return False
        self.delivered = True
        self.answered += 1
        if not response.keep_alive and self.transport is not None and self.transport.can_write_eof():
            # Our side ends now: the client reads the answer to the end while aiohttp reads, for a moment, what
            # it still sends (lingering close) rather than reset the connection and maybe the answer with it.
            self.transport.write_eof()
        return True

    async def finish_response(self, request, resp, start_time):
        """aiohttp's own answers (its parse errors) under the same write deadline as ours (:meth:`send`)."""
        try:
            async with asyncio.timeout(self.rest.timeout_seconds):
                return await super().finish_response(request, resp, start_time)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()
            return resp, True

    def force_close(self) -> None:
        if self.transport is not None and self.transport.get_write_buffer_size():
            self.transport.abort()  # closing would wait for a client that does not read
        super().force_close()

    def handle_error(self, request, status=500, exc=None, message=None):
        """aiohttp's own answers (a malformed request line or header) in JSON too."""
        if request.writer.output_size > 0:
            raise ConnectionError("The answer is under way: no error answer can follow")
        if status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
        text = message or (http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ else "")
        response = web.Response(status=status, text=json.dumps({"error": text}), content_type="application/json")
        response.force_close()
        if not request.get(_HANDLED):  # a request of its own (a parse error), not one handle answered
            self.rest.metrics.answered("other", "", status, 0.0)
        return response


class _Refusal(asyncio.Protocol):
    """A connection over ``max_connections``: answered 503 at once, read for a moment, closed."""

    def __init__(self, rest: RestServer):
        self.rest = rest
        self.transport = None
        self._close = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        why = "The server is stopping; retry" if self.rest.stopping else "The server is at its connection limit"
        data = json.dumps({"error": f"{why}; retry later"}).encode()
        head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        transport.write(head.encode() + b"Connection: close\r\n\r\n" + data)
        if transport.can_write_eof():
            transport.write_eof()
        self._close = asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.abort)

    def data_received(self, data: bytes) -> None:
        pass  # read, so that closing does not reset the connection before the client has the answer

    def eof_received(self) -> bool:
        self.transport.close()
        return True

    def connection_lost(self, exc) -> None:
        if self._close is not None:
            self._close.cancel()
        self.rest._refusing -= 1


def _size(array) -> int:
    """About how many bytes ``array`` takes in JSON: its strings' lengths, or its numbers'."""
    if array.dtype == object:
        return sum(len(item) for item in array.flat)
    return array.nbytes


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
    max_connections: int = 4096,
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
            max_connections,
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

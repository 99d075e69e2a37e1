"""TF Serving's REST API on aiohttp's web server, with the limits real traffic needs.

  GET  /v1/models/<name>[/versions/<v>|/labels/<l>]            version status (TF Serving's)
  GET  /v1/models/<name>[/versions/<v>|/labels/<l>]/metadata   signatures (TF Serving's)
  POST /v1/models/<name>[/versions/<v>|/labels/<l>]:predict    TF Serving's predict (:mod:`.rest_api`)
  GET  /monitoring/prometheus/metrics                 Prometheus metrics (TF Serving's path, :mod:`.metrics`)
  GET  /healthz                                       200 while the process serves HTTP
  GET  /readyz                                        200 once the models are loaded, 503 before and when stopping

aiohttp does the HTTP: HTTP/1.1 with keep-alive, pipelining and chunked bodies
on one event loop (an idle connection costs a socket, no thread); routing (its
router answers 404 and 405); the body limit (``client_max_size``: 413); the
idle timeout (``keepalive_timeout``); ``Expect: 100-continue`` (the predict
route's expect handler sends it unless the body is over the limit, as aiohttp's
docs show); and start and graceful stop (:class:`aiohttp.web.AppRunner`: a stop
closes idle connections, waits up to its shutdown timeout for the requests in
flight, then closes the rest). One middleware answers every error in TF
Serving's JSON ``{"error": …}``, aiohttp's own 404, 405 and 413 too; only a
request aiohttp cannot parse gets its plain-text 400.

Ours, because aiohttp has nothing for it:

- a request's deadlines: its body must arrive within ``timeout_seconds`` of its
  headers (else 408), and its answer be written within ``timeout_seconds``
  (else the connection is dropped, so that a client that does not read cannot
  hold it: aiohttp's writes wait for the client without a limit);
- the connection ceiling: beyond ``max_connections`` open connections, a new
  one is answered 503 at once and closed. An aiohttp site cannot choose a
  protocol per connection, so the listening socket is asyncio's, with aiohttp's
  server as its protocol factory (aiohttp's low-level use) and :class:`_Refusal`
  over the limit;
- JSON over ``INLINE_BYTES`` and decoding without batching run on a pool of
  ``rest_api_num_threads`` threads, so that the loop never waits for them long
  (smaller JSON is handled on the loop: a thread hop costs more).

Every client mistake is a 4xx with a JSON ``{"error": …}``; a 500 means a fault
of the server. docs/serving.md says why aiohttp and what to expect.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import threading
import time

from absl import logging
from aiohttp import HttpVersion11, web

from tf_transformer.exporting.export_info import graph_error
from tf_transformer.serving import metrics as metrics_lib
from tf_transformer.serving.core import ServingCore, refused_by_graph
from tf_transformer.serving.rest_api import (
    ClientError,
    encode_response,
    parse_json,
    parse_predict,
)
from tf_transformer.serving.versions import ModelVersions

_MODEL = "/v1/models/{name:[^/:]+}"
_VERSION = "/versions/{version:[0-9]{1,18}}"
_LABEL = "/labels/{label:[^/:]+}"
LINGER_SECONDS = 0.5  # after an answer, how long the unread rest of its body is read (aiohttp's lingering close)
MAX_REFUSING = 64  # 503s being written at once; beyond, a connection over the limit is closed unanswered
INLINE_BYTES = 64 << 10  # JSON up to this size is parsed or encoded on the event loop: a thread hop costs more
BACKLOG = 128  # connections the kernel holds before they are accepted
# The metric labels of the request being answered: its model, the route's name as its API, a predict's signature.
_LABELS: contextvars.ContextVar[dict] = contextvars.ContextVar("labels")


class RestServer:
    """The HTTP server: binds at once; :meth:`serve_forever` serves, :meth:`stop` (any thread) ends it gracefully.

    Args:
      core: the models, batching queue and metrics (:class:`~.core.ServingCore`),
        shared with the gRPC server; ``core.options`` say how to listen
        (``rest_api_port``) and bound requests.
    """

    def __init__(self, core: ServingCore):
        self.core = core
        self.models = core.models
        self.options = options = core.options
        self.metrics = core.metrics
        self.socket = socket.create_server((options.host, options.rest_api_port), backlog=BACKLOG)
        self.server_address = self.socket.getsockname()[:2]
        self._pool = core.pool
        self.app = self._application()
        self._connections: web.Server | None = None  # aiohttp's protocol factory, which lists open connections
        self.metrics.connections.set_function(lambda: self.open_connections)
        self._refusing = 0  # connections being answered 503
        self.stopping = False
        self._state = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None  # set to stop
        self._serving = False
        self._released = False
        self._served = threading.Event()  # serve_forever has returned

    def _application(self) -> web.Application:
        @web.middleware
        async def answer(request: web.Request, handler) -> web.StreamResponse:
            return await self._answer(request, handler)

        app = web.Application(client_max_size=self.options.max_request_bytes, middlewares=[answer])
        app.router.add_get("/healthz", self._healthz, name="healthz")
        app.router.add_get("/readyz", self._readyz, name="readyz")
        app.router.add_get(metrics_lib.PATH, self._metrics, name="metrics")
        for model in (_MODEL, _MODEL + _VERSION, _MODEL + _LABEL):
            app.router.add_get(model, self._status)
            app.router.add_get(model + "/metadata", self._metadata)
            app.router.add_post(model + ":predict", self._predict, expect_handler=_continue_unless_too_large)
        return app

    @property
    def open_connections(self) -> int:
        """HTTP connections open now (503 refusals not counted)."""
        return len(self._connections.connections) if self._connections is not None else 0

    # Serving and stopping.

    @property
    def stopping(self) -> bool:
        return self.core.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.core.stopping = value

    def serve_forever(self, stop_signals: tuple[int, ...] = ()) -> None:
        """Serves until :meth:`stop` or one of ``stop_signals``; then stops gracefully and returns."""
        with self._state:
            serve = not self.stopping
            self._serving = serve
        try:
            if serve:
                asyncio.run(self._serve(stop_signals))
        finally:
            self._release()
            self._served.set()

    async def _serve(self, stop_signals: tuple[int, ...]) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        for signum in stop_signals:
            loop.add_signal_handler(signum, self._on_signal, signum)
        runner = web.AppRunner(
            self.app,
            access_log=None,  # one line per request is too much at load; the metrics count them
            keepalive_timeout=self.options.timeout_seconds,
            lingering_time=LINGER_SECONDS,
            shutdown_timeout=self.options.timeout_seconds,
        )
        await runner.setup()
        self._connections = runner.server
        listener = await loop.create_server(self._protocol, sock=self.socket)
        with self._state:
            self._loop = loop
            if self.stopping:
                self._wake.set()
        try:
            await self._wake.wait()
        finally:
            listener.close()  # no more connections; those the kernel holds unaccepted are reset
            await runner.cleanup()
            for signum in stop_signals:
                loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        logging.info("Signal %d: finishing the requests in flight", signum)
        self.stopping = True
        self._wake.set()

    def stop(self) -> None:
        """Stops accepting, closes idle connections, finishes the requests in flight, then releases all.

        The requests in flight (decoding, waiting in a batch, or with their
        body arriving) are answered within ``rest_api_timeout_in_ms``, with
        ``Connection: close``; a predict read after the stop began is answered
        503 "stopping; retry". Call from another thread than :meth:`serve_forever`'s.
        """
        with self._state:
            self.stopping = True
            loop, serving = self._loop, self._serving
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the loop has ended meanwhile
                pass
        if serving:
            self._served.wait()
        else:
            self._release()

    def _release(self) -> None:
        """Closes the socket, then releases the core (its threads, the models' loading); once."""
        with self._state:
            if self._released:
                return
            self._released = True
        self.socket.close()
        self.core.release()

    def _protocol(self) -> asyncio.BaseProtocol:
        """The protocol of a connection just accepted: aiohttp's, or a 503 at once over ``max_connections``."""
        if self.open_connections + self._refusing < self.options.max_connections:
            return self._connections()
        self.metrics.refused.inc()
        if self._refusing < MAX_REFUSING:
            return _Refusal(self)
        return _Drop()  # a flood: closed unanswered rather than sockets held without bound

    # Every request: deadlines, errors as JSON, metrics.

    async def _answer(self, request: web.Request, handler) -> web.StreamResponse:
        """Runs the route's ``handler``, answers its result or error in JSON within the deadline, counts it."""
        started = time.perf_counter()
        labels = {"model": request.match_info.get("name", ""), "api": request.match_info.route.name or "other"}
        labels["signature"] = ""
        _LABELS.set(labels)
        try:
            response = await handler(request)
        except web.HTTPException as error:  # aiohttp's own (404, 405, 413) and ours
            response = self._http_error(request, error)
        except ClientError as error:
            response = _error(error.status, str(error))
        except Exception as error:  # a fault of ours; the server stays up
            if refused_by_graph(error):  # the graph refused the input: the client's mistake
                response = _error(400, graph_error(error))
            else:
                logging.exception("%s %s failed", request.method, request.path)
                response = _error(500, f"{type(error).__name__}: {error}")
        if self.stopping or (response.status >= 500 and response.status != 503):
            response.force_close()
        if await self._send(request, response):
            seconds = time.perf_counter() - started
            self.metrics.answered(labels["model"], "rest", labels["api"], labels["signature"], response.status, seconds)
        return response

    def _http_error(self, request: web.Request, error: web.HTTPException) -> web.Response:
        if isinstance(error, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(error.allowed_methods))
            message = f"{request.method} is not allowed at {request.path}: {allowed}"
            return _error(405, message, {"Allow": error.headers["Allow"]})
        if isinstance(error, web.HTTPNotFound):
            served = ", ".join(f"/v1/models/{name}" for name in self.models.names)
            return _error(404, f"No resource at {request.path}; this server serves {served}")
        return _error(error.status, error.text or error.reason)

    async def _send(self, request: web.Request, response: web.StreamResponse) -> bool:
        """Writes ``response`` within ``timeout_seconds``, or drops the connection; whether it was written."""
        transport = request.transport
        if transport is None:
            return False
        # Writes wait until the kernel has taken every byte, so that the deadline covers the whole answer: bytes
        # left in asyncio's buffer would keep a closed connection open for as long as the client does not read.
        transport.set_write_buffer_limits(high=0)
        try:
            async with asyncio.timeout(self.options.timeout_seconds):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            transport.abort()  # its unread answer goes with it
            return False
        except ConnectionError:
            return False
        return True

    # The routes.

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "serving"})

    async def _readyz(self, request: web.Request) -> web.Response:
        names = self.models.names
        if self.models.ready and not self.stopping:
            return web.json_response({"ready": True, "models": names})
        error = "The server is stopping" if self.stopping else self.models.failure()
        return web.json_response({"ready": False, "models": names, "error": error}, status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _status(self, request: web.Request) -> web.Response:
        _LABELS.get()["api"] = "status"
        versions, version, label = self._model(request)
        if label is not None:
            version = str(versions.servable(label=label).version)
        return web.json_response(versions.status(version))

    async def _metadata(self, request: web.Request) -> web.Response:
        _LABELS.get()["api"] = "metadata"
        versions, version, label = self._model(request)
        metadata = versions.servable(version, label).metadata()
        metadata["model_spec"] = {"name": versions.name, **metadata["model_spec"]}
        return web.json_response(metadata)

    async def _predict(self, request: web.Request) -> web.Response:
        labels = _LABELS.get()
        labels["api"] = "predict"  # a 413, 408 or 411 on its body counts as one of predict's
        versions, version, label = self._model(request)
        servable = versions.servable(version, label)
        body = await self._body(request)

        def parse():
            parsed = parse_predict(parse_json(body), servable.input_kinds, self.options.max_batch_size)
            servable.check(parsed)
            return parsed

        predict = parse() if len(body) <= INLINE_BYTES else await self._in_pool(parse)
        labels["signature"] = predict.signature
        outputs = await self._run(versions.name, servable, predict)
        limit = self.options.max_response_bytes
        if sum(_size(value) for value in outputs.values()) <= INLINE_BYTES:
            data = encode_response(predict, outputs, limit)
        else:
            data = await self._in_pool(encode_response, predict, outputs, limit)
        return web.Response(body=data, content_type="application/json")

    def _model(self, request: web.Request) -> tuple[ModelVersions, str | None, str | None]:
        """The model the path names, and the version or label it names (``None``: the highest served)."""
        versions = self.models.get(request.match_info["name"])
        return versions, request.match_info.get("version"), request.match_info.get("label")

    async def _body(self, request: web.Request) -> bytes:
        """The request body, read by its deadline; aiohttp's 413 over ``client_max_size``."""
        length = request.content_length
        if length is None and "chunked" not in request.headers.get("Transfer-Encoding", "").lower():
            raise ClientError("A request body needs a Content-Length header or chunked Transfer-Encoding", 411)
        if length is not None and length > request.client_max_size:  # refused before a byte of it is read
            raise web.HTTPRequestEntityTooLarge(max_size=request.client_max_size, actual_size=length)
        seconds = self.options.timeout_seconds
        try:
            async with asyncio.timeout(seconds):
                return await request.read()
        except TimeoutError:
            raise ClientError(f"The request body did not arrive within {seconds:g} s", 408) from None
        except web.RequestPayloadError as error:  # a malformed chunked body, or one cut short
            raise ClientError(f"Malformed request body: {error}") from None
        except ConnectionError:  # the client went away: nobody to answer, nothing to log
            raise ClientError("The connection closed before the whole body arrived") from None

    async def _run(self, model: str, servable, request):
        return await asyncio.wrap_future(self.core.submit(model, servable, request))

    async def _in_pool(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)


async def _continue_unless_too_large(request: web.Request) -> web.Response | None:
    """``Expect: 100-continue``: the client sends its body once told to; a body over the limit is not asked for,
    the handler answers 413 instead. Writes the interim answer as aiohttp's docs do."""
    if request.headers.get("Expect", "").lower() != "100-continue":
        return _error(417, f"Unknown Expect: {request.headers['Expect']}; only 100-continue is understood")
    length = request.content_length
    if request.version >= HttpVersion11 and (length is None or length <= request.client_max_size):
        request.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class _Refusal(asyncio.Protocol):
    """A connection over ``max_connections``: answered 503 at once, read for a moment, closed."""

    def __init__(self, server: RestServer):
        self.server = server
        self.transport = None
        self._close = None
        server._refusing += 1

    def connection_made(self, transport) -> None:
        self.transport = transport
        why = "The server is stopping" if self.server.stopping else "The server is at its connection limit"
        data = f'{{"error": "{why}; retry later"}}'.encode()
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
        self.server._refusing -= 1


class _Drop(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        transport.abort()


def _size(array) -> int:
    """About how many bytes ``array`` takes in JSON: its strings' lengths, or its numbers'."""
    if array.dtype == object:
        return sum(len(item) for item in array.flat)
    return array.nbytes

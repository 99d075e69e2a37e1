"""RestServer with a stand-in model: bounded connections, graceful stop, answers while loading (no TensorFlow)."""

import concurrent.futures
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings

from configs.serving import ServingOptions
from tests.serving.bodies import raw_bodies
from tests.serving.client import raw_exchange, request, responses
from tf_transformer.serving import make_server
from tf_transformer.serving.core import ServingCore
from tf_transformer.serving.http_server import RestServer
from tf_transformer.serving.models import ModelRegistry
from tf_transformer.serving.versions import ModelVersions


class SlowModel:
    """A servable whose decoding takes ``seconds``."""

    version = 1
    input_kinds = {"serving_default": "strings"}

    def __init__(self, seconds=0.0):
        self.seconds = seconds

    def check(self, request):
        pass

    def run(self, signature, rows):
        time.sleep(self.seconds)
        return {"translations": np.array([row.upper().encode() for row in rows], object)}

    def warm_up(self):
        return 0, 0.0


class Versions:
    name = "m"
    ready = True
    first_load_ended = True

    def __init__(self, model):
        self.model = model

    def servable(self, version=None, label=None):
        return self.model

    def status(self, version=None):
        return {"model_version_status": [{"version": "1", "state": "AVAILABLE"}]}

    def load_seconds(self):
        return {1: 0.5}

    def warmup_seconds(self):
        return {1: 0.25}

    def stop(self):
        pass


def start(model, batching=False, **options):
    """A server of ``model`` on a free port, serving in a thread (``options``: ``ServingOptions`` fields)."""
    options = ServingOptions(
        port=0, rest_api_port=0, enable_batching=batching, max_batch_size=8, num_batch_threads=1, **options
    )
    server = RestServer(ServingCore(ModelRegistry([Versions(model)]), options))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, server.server_address[1]


def test_connections_over_the_limit_get_503_at_once():
    server, port = start(SlowModel(), max_connections=2)
    try:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # idle keep-alive clients
        time.sleep(0.3)
        [(status, reply)] = responses(raw_exchange(port, b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10))
        assert status == 503 and "connection limit" in reply["error"]
        for connection in held:
            connection.close()
        deadline = time.monotonic() + 20
        while True:  # the slots come back once the server sees the clients gone
            get = b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            status = responses(raw_exchange(port, get))[0][0]
            if status == 200:
                break
            assert status == 503 and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        server.stop()


def test_stop_answers_the_request_in_flight_and_closes_idle_connections():
    server, port = start(SlowModel(seconds=1.5), batching=True, rest_api_timeout_in_ms=60_000)
    idle = socket.create_connection(("127.0.0.1", port))
    answer = {}
    client = threading.Thread(
        target=lambda: answer.update(reply=request(port, "POST", "/v1/models/m:predict", {"instances": ["ab"]}))
    )
    client.start()
    time.sleep(0.5)  # decoding
    stopper = threading.Thread(target=server.stop)
    started = time.monotonic()
    stopper.start()
    stopper.join(30)
    client.join(30)
    assert not stopper.is_alive() and time.monotonic() - started < 20  # the idle connection did not hold it up
    assert answer["reply"] == (200, {"predictions": [{"translations": "AB"}]})
    idle.settimeout(5)
    assert idle.recv(1024) == b""


def test_a_client_that_dribbles_its_request_is_cut_off():
    """A byte every 0.3 s beats a per-read timeout of 1 s; the connection's idle timeout still ends it, mid-dribble."""
    import select

    server, port = start(SlowModel(), rest_api_timeout_in_ms=1000)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            started, closed_after = time.monotonic(), None
            for byte in b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{":
                try:
                    slow.sendall(bytes([byte]))
                    time.sleep(0.3)
                    if select.select([slow], [], [], 0)[0] and slow.recv(65536) == b"":  # closed by the server
                        closed_after = time.monotonic() - started
                except OSError:
                    closed_after = time.monotonic() - started
                if closed_after is not None or time.monotonic() - started > 8:
                    break
            assert closed_after is not None and closed_after < 5, closed_after
        assert request(port, "GET", "/v1/models/m", timeout=10)[0] == 200
    finally:
        server.stop()


def test_expect_100_continue_gets_413_before_the_body():
    server, port = start(SlowModel(), max_request_bytes=100)
    try:
        head = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n"
        [(status, reply)] = responses(raw_exchange(port, head, timeout=10))
        assert status == 413 and "Maximum request body size 100 exceeded" in reply["error"]
        odd = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: something-else\r\n"
        [(status, reply)] = responses(raw_exchange(port, odd + b"Connection: close\r\n\r\n{}", timeout=10))
        assert status == 417 and "Unknown Expect" in reply["error"]
        put = b"PUT /v1/models/m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        [(status, reply)] = responses(raw_exchange(port, put, timeout=10))
        assert status == 405 and "PUT is not allowed" in reply["error"]  # the router's errors, as JSON too
        get = b"GET /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        [(status, reply)] = responses(raw_exchange(port, get, timeout=10))
        assert status == 405 and "POST" in reply["error"]
    finally:
        server.stop()


def test_answers_while_the_model_loads_then_becomes_ready(tmp_path, monkeypatch):
    """make_server binds first: readiness and predict 503, the version LOADING; once loaded, 200 and AVAILABLE."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "saved_model.pb").write_bytes(b"graph")
    loading, release = threading.Event(), threading.Event()

    def slow_load(path, version):
        loading.set()
        assert release.wait(10), "make_server waited for the load"
        return SlowModel()

    from_path = classmethod(lambda cls, path, name=None: cls([ModelVersions(path, name, slow_load)]))
    monkeypatch.setattr(ModelRegistry, "from_path", from_path)
    server = make_server(str(tmp_path / "m"), ServingOptions(port=0, rest_api_port=0, file_system_poll_wait_seconds=0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert loading.wait(10)
        status, body = request(port, "GET", "/readyz", timeout=10)
        assert status == 503 and body["ready"] is False and body["error"] == "m is loading"
        version = {"version": "1", "state": "LOADING", "status": {"error_code": "OK", "error_message": ""}}
        assert request(port, "GET", "/v1/models/m", timeout=10) == (200, {"model_version_status": [version]})
        status, body = request(port, "POST", "/v1/models/m:predict", {"instances": ["ab"]}, timeout=10)
        assert status == 503 and "No version of m is loaded yet" in body["error"]

        release.set()
        assert server.versions.wait_loaded(10)
        assert request(port, "GET", "/readyz", timeout=10) == (200, {"ready": True, "models": ["m"]})
        assert request(port, "GET", "/v1/models/m", timeout=10) == (
            200,
            {"model_version_status": [{**version, "state": "AVAILABLE"}]},
        )
        assert request(port, "POST", "/v1/models/m:predict", {"instances": ["ab"]}, timeout=10) == (
            200,
            {"predictions": [{"translations": "AB"}]},
        )
    finally:
        release.set()
        server.stop()


class BigAnswer:
    """A servable whose answer is one string of ``size`` bytes per sentence, at once."""

    version = 1
    input_kinds = {"serving_default": "strings"}

    def __init__(self, size):
        self.size = size

    def check(self, request):
        pass

    def run(self, signature, rows):
        return {"translations": np.array([b"x" * self.size for _ in rows], object)}


def test_an_answer_over_max_response_bytes_is_413_naming_the_limit():
    big = BigAnswer(2_000_000)
    server, port = start(big, max_response_bytes=1_000_000)
    try:
        status, reply = request(port, "POST", "/v1/models/m:predict", {"instances": ["a"]}, timeout=30)
        assert status == 413 and "max_response_bytes" in reply["error"] and "1000000" in reply["error"], reply
        big.size = 10
        status, reply = request(port, "POST", "/v1/models/m:predict", {"instances": ["a", "b"]}, timeout=30)
        assert status == 200 and reply == {"predictions": [{"translations": "x" * 10}] * 2}
    finally:
        server.stop()


def test_a_client_that_does_not_read_its_answer_frees_the_thread_at_the_deadline():
    """Writing an answer has a deadline (rest_api_timeout_in_ms): a reader that never reads, or one that reads a
    little now and then, cannot hold the only handler thread."""
    server, port = start(
        BigAnswer(40_000_000), rest_api_num_threads=1, rest_api_timeout_in_ms=1000, max_response_bytes=100_000_000
    )
    body = b'{"instances": ["a"]}'
    head = f"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    try:
        with (
            socket.create_connection(("127.0.0.1", port)) as silent,
            socket.create_connection(("127.0.0.1", port)) as trickle,
        ):
            for reader in (silent, trickle):
                reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                reader.sendall(head + body)
            started = time.monotonic()
            trickle.settimeout(0.2)
            while time.monotonic() - started < 3:  # 4 KB every 0.2 s: never done within the deadline
                try:
                    if not trickle.recv(4096):
                        break
                except TimeoutError:
                    pass
                time.sleep(0.2)
            status, _ = request(port, "GET", "/v1/models/m", timeout=10)  # needs the thread
            assert status == 200 and time.monotonic() - started < 5
    finally:
        server.stop()


def test_stop_answers_every_request_already_received():
    """On stop, a request the server has received is answered (the one decoding 200, the one queued behind it 200
    or 503), never closed unanswered, and its connection closed after."""
    server, port = start(SlowModel(seconds=2.0), rest_api_num_threads=1, rest_api_timeout_in_ms=30_000)
    body = b'{"instances": ["ab"]}'
    predict = f"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    answers = {}

    def exchange(name, connection):
        data, error = b"", None
        try:
            while chunk := connection.recv(65536):
                data += chunk
        except OSError as raised:
            error = raised
        answers[name] = (data, error)

    in_flight = socket.create_connection(("127.0.0.1", port), timeout=30)
    in_flight.sendall(predict)
    time.sleep(0.5)  # decoding, on the only decoding thread
    waiting = socket.create_connection(("127.0.0.1", port), timeout=30)
    waiting.sendall(predict)  # read; waits for the thread
    time.sleep(0.3)
    connections = {"in flight": in_flight, "waiting": waiting}
    readers = [threading.Thread(target=exchange, args=item) for item in connections.items()]
    for reader in readers:
        reader.start()
    server.stop()
    for reader in readers:
        reader.join(30)
    for connection in connections.values():
        connection.close()
    statuses = {}
    for name, (data, error) in answers.items():
        assert error is None and data, (name, data, error)
        [(status, reply)] = responses(data)
        statuses[name] = status
        assert status == 200 or (status == 503 and "stopping" in reply["error"]), (name, status, reply)
    assert statuses["in flight"] == 200


class EchoModel:
    """A servable of both input kinds that answers at once."""

    version = 1
    input_kinds = {"serving_default": "strings", "translate_ids": "ids"}

    def check(self, request):
        pass

    def run(self, signature, rows):
        if signature == "serving_default":
            return {"translations": np.array([row.encode() for row in rows], object)}
        return {"ids": np.array([[len(row)] for row in rows], np.int32)}


@pytest.fixture(scope="module")
def echo_port():
    server, port = start(EchoModel(), batching=True)
    yield port
    server.stop()


@settings(max_examples=200, deadline=None)
@given(raw_bodies())
def test_any_raw_body_over_http_is_answered_and_never_500(echo_port, raw):
    """Bodies as bytes (tests/serving/test_rest_api.py), through the handler: 200 or a 4xx, never a 500."""
    status, reply = request(echo_port, "POST", "/v1/models/m:predict", raw=raw, timeout=30)
    assert status == 200 or (400 <= status < 500 and isinstance(reply["error"], str)), (status, reply)


def test_keep_alive_answers_several_requests_on_one_connection_and_pipelined_ones_in_order(echo_port):
    import http.client
    import json

    connection = http.client.HTTPConnection("127.0.0.1", echo_port, timeout=30)
    try:
        sockets = set()
        for i in range(5):
            body = json.dumps({"instances": [f"s{i}"]})
            connection.request("POST", "/v1/models/m:predict", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            reply = json.loads(response.read())
            assert response.status == 200 and reply == {"predictions": [{"translations": f"s{i}"}]}
            sockets.add(id(connection.sock))
        assert len(sockets) == 1  # never reconnected
    finally:
        connection.close()
    bodies = [json.dumps({"instances": [f"p{i}"]}).encode() for i in range(3)]
    pipelined = b"".join(
        f"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        for body in bodies
    )
    last = b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answers = responses(raw_exchange(echo_port, pipelined + last))
    assert answers[:3] == [(200, {"predictions": [{"translations": f"p{i}"}]}) for i in range(3)]
    assert answers[3][0] == 200 and len(answers) == 4


def test_a_chunked_request_body_is_read_and_one_over_the_limit_is_413():
    import http.client
    import json

    server, port = start(EchoModel(), max_request_bytes=1000)
    try:
        for pieces, expected in (
            ([b'{"instances": ', b'["chunk', b'ed"]}'], (200, {"predictions": [{"translations": "chunked"}]})),
            ([b'{"instances": ["'] + [b"a" * 100] * 20 + [b'"]}'], 413),
        ):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", "/v1/models/m:predict", body=iter(pieces), encode_chunked=True)
                response = connection.getresponse()
                reply = (response.status, json.loads(response.read()))
            finally:
                connection.close()
            if expected == 413:
                assert reply[0] == 413 and "Maximum request body size 1000" in reply[1]["error"], reply
            else:
                assert reply == expected
    finally:
        server.stop()


def test_a_thousand_idle_connections_are_held_while_predictions_answer():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2500:  # both ends of each connection live in this process
        if hard != resource.RLIM_INFINITY and hard < 2500:
            pytest.skip(f"needs 2,500 file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2500, hard))
    server, port = start(EchoModel(), batching=True, rest_api_timeout_in_ms=120_000)
    idle = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        for i, connection in enumerate(idle[::100]):  # some idle after a request, the rest before any
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert connection.recv(65536).startswith(b"HTTP/1.1 200"), i
        deadline = time.monotonic() + 30
        while server.open_connections < 1000:  # accepted, one by one, on the event loop
            assert time.monotonic() < deadline, server.open_connections
            time.sleep(0.05)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(
                pool.map(
                    lambda i: request(port, "POST", "/v1/models/m:predict", {"instances": [f"s{i}"]}, timeout=30),
                    range(32),
                )
            )
        assert replies == [(200, {"predictions": [{"translations": f"s{i}"}]}) for i in range(32)]
        for connection in idle[:10]:  # still open: nothing to read, no end of input
            connection.setblocking(False)
            with pytest.raises(BlockingIOError):
                connection.recv(1)
    finally:
        for connection in idle:
            connection.close()
        server.stop()


def test_metrics_count_requests_batches_and_versions():
    from prometheus_client.parser import text_string_to_metric_families

    server, port = start(EchoModel(), batching=True)
    try:
        for i in range(3):
            assert request(port, "POST", "/v1/models/m:predict", {"instances": [f"a{i}", "b"]})[0] == 200
        assert request(port, "POST", "/v1/models/m:predict", raw=b"{")[0] == 400
        assert request(port, "GET", "/v1/models/other")[0] == 404
        assert request(port, "GET", "/nowhere")[0] == 404
        connection = socket.create_connection(("127.0.0.1", port), timeout=30)
        connection.sendall(b"GET /monitoring/prometheus/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := connection.recv(65536):
            data += chunk
        connection.close()
        head, _, text = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"Content-Type: text/plain; version=" in head
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text.decode())
            for sample in family.samples
        }

        def value(name, **labels):
            return samples[(name, tuple(sorted({"model": "m", **labels}.items())))]

        def served(name, **labels):  # a request's series: the model it named, REST
            return value(name, protocol="rest", **labels)

        assert served("tft_serving_requests_total", api="predict", signature="serving_default", status="200") == 3
        assert served("tft_serving_requests_total", api="predict", signature="", status="400") == 1
        assert served("tft_serving_requests_total", api="status", signature="", status="404", model="other") == 1
        assert served("tft_serving_requests_total", api="other", signature="", status="404", model="") == 1
        assert served("tft_serving_request_latency_seconds_count", api="predict", signature="serving_default") == 3
        assert value("tft_serving_batch_size_sum") == 6  # three batches of two sentences (one request each)
        assert value("tft_serving_batch_size_count") == 3
        assert value("tft_serving_queue_wait_seconds_count") == 3
        assert value("tft_serving_model_version_state", version="1", state="AVAILABLE") == 1
        assert value("tft_serving_model_load_seconds", version="1") == 0.5
        assert value("tft_serving_model_warmup_seconds", version="1") == 0.25
        assert samples[("tft_serving_open_connections", ())] == 1  # this scrape's
    finally:
        server.stop()


def test_a_keep_alive_connection_in_use_outlives_the_request_deadline():
    """Each request has the timeout from its own first byte: requests every 0.4 s keep a connection with a 1 s
    timeout open for longer than that, and a request started well after the last one is still read."""
    import http.client

    server, port = start(EchoModel(), rest_api_timeout_in_ms=1000)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sockets = set()
        for _ in range(6):  # 2.4 s in all
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 200 and response.read() == b'{"status": "serving"}'
            sockets.add(id(connection.sock))
            time.sleep(0.4)
        assert len(sockets) == 1
    finally:
        connection.close()
        server.stop()


def _server_side(client: socket.socket) -> socket.socket:
    """The server's end of ``client``'s connection, found among this process's open sockets."""
    import os

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # once the server has accepted it
        for fd in os.listdir("/proc/self/fd"):
            try:
                candidate = socket.socket(fileno=os.dup(int(fd)))
            except OSError:
                continue
            try:
                if candidate.getsockname() == client.getpeername() and candidate.getpeername() == client.getsockname():
                    return candidate
            except OSError:
                pass
            candidate.close()
        time.sleep(0.05)
    raise AssertionError("the server's end of the connection is not open")


def test_a_connection_with_an_unread_answer_is_released_and_does_not_hold_up_a_stop():
    """A client that pipelines requests and reads no answer, until some answers wait in the server's own buffer
    (less than asyncio's high-water mark, so no write waits for them): the connection must still be dropped at the
    write deadline (closing it would wait for the client to read those bytes), so it leaves the server's count and
    a stop does not wait for it."""
    server, port = start(EchoModel(), rest_api_timeout_in_ms=1000)
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    silent.connect(("127.0.0.1", port))
    silent.settimeout(10)
    try:
        with _server_side(silent) as server_end:  # small kernel buffers: the rest of the answers wait in asyncio's
            server_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        for _ in range(10):  # about 36 KB of answers in all
            silent.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 20)
            time.sleep(0.02)
        deadline = time.monotonic() + 15
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.open_connections
        started = time.monotonic()
        server.stop()  # the client is still there, still not reading
        assert time.monotonic() - started < 5
    finally:
        silent.close()
        server.stop()

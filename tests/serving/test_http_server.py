"""RestServer with a stand-in model: bounded connections, graceful stop, answers while loading (no TensorFlow)."""

import functools
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings

from tests.serving.bodies import raw_bodies
from tests.serving.client import raw_exchange, request, responses
from tf_transformer.serving import http_server
from tf_transformer.serving.batching import BatchScheduler
from tf_transformer.serving.http_server import RestServer
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


class Versions:
    name = "m"
    ready = True

    def __init__(self, model):
        self.model = model

    def servable(self, version=None):
        return self.model

    def status(self, version=None):
        return {"model_version_status": [{"version": "1", "state": "AVAILABLE"}]}

    def stop(self):
        pass


def start(model, batching=False, **kwargs):
    scheduler = BatchScheduler(8, 1000) if batching else None
    server = RestServer(("127.0.0.1", 0), Versions(model), scheduler, **kwargs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, server.server_address[1]


def test_connections_over_the_limit_get_503_at_once():
    server, port = start(SlowModel(), num_threads=1)  # one handled, one waiting
    try:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # idle keep-alive clients
        time.sleep(0.3)
        [(status, reply)] = responses(raw_exchange(port, b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10))
        assert status == 503 and "connection limit" in reply["error"]
        for connection in held:
            connection.close()
        deadline = time.monotonic() + 20
        while True:  # the slots come back once the handlers see the clients gone
            status = responses(raw_exchange(port, b"GET /v1/models/m HTTP/1.1\r\nConnection: close\r\n\r\n"))[0][0]
            if status == 200:
                break
            assert status == 503 and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        server.stop()


def test_stop_answers_the_request_in_flight_and_closes_idle_connections():
    server, port = start(SlowModel(seconds=1.5), batching=True, timeout_seconds=60)
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
    """A byte every 0.3 s beats a per-read timeout of 1 s; the request's deadline still ends it, mid-dribble."""
    import select

    server, port = start(SlowModel(), timeout_seconds=1.0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            started, closed_after = time.monotonic(), None
            for byte in b"POST /v1/models/m:predict HTTP/1.1\r\nContent-Length: 5\r\n\r\n{":
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
        head = b"POST /v1/models/m:predict HTTP/1.1\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n"
        [(status, reply)] = responses(raw_exchange(port, head, timeout=10))
        assert status == 413 and "exceeds the limit of 100" in reply["error"]
        [(status, reply)] = responses(raw_exchange(port, b"PUT /v1/models/m HTTP/1.1\r\n\r\n", timeout=10))
        assert status == 501 and reply["error"]  # http.server's own errors, as JSON too
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

    monkeypatch.setattr(http_server, "ModelVersions", functools.partial(ModelVersions, load=slow_load))
    server = http_server.make_server(str(tmp_path / "m"), port=0, poll_seconds=0)
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
        assert request(port, "GET", "/readyz", timeout=10) == (200, {"ready": True, "model": "m"})
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
    server, port = start(BigAnswer(2_000_000), max_response_bytes=1_000_000)
    try:
        status, reply = request(port, "POST", "/v1/models/m:predict", {"instances": ["a"]}, timeout=30)
        assert status == 413 and "max_response_bytes" in reply["error"] and "1000000" in reply["error"], reply
        server.versions.model.size = 10
        status, reply = request(port, "POST", "/v1/models/m:predict", {"instances": ["a", "b"]}, timeout=30)
        assert status == 200 and reply == {"predictions": [{"translations": "x" * 10}] * 2}
    finally:
        server.stop()


def test_a_client_that_does_not_read_its_answer_frees_the_thread_at_the_deadline():
    """Writing an answer has a deadline (timeout_seconds): a reader that never reads, or one that reads a little now
    and then, cannot hold the only handler thread."""
    server, port = start(BigAnswer(40_000_000), num_threads=1, timeout_seconds=1.0, max_response_bytes=100_000_000)
    body = b'{"instances": ["a"]}'
    head = f"POST /v1/models/m:predict HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
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


def test_stop_answers_every_connection_already_accepted():
    """On stop, a connection the server has accepted is answered (the request in flight 200, the others 200 or
    503), never closed unanswered: connections waiting for a handler thread, and those the kernel has accepted
    but the server not yet taken (simulated by ending the accept loop before stop())."""
    server, port = start(SlowModel(seconds=2.0), batching=True, num_threads=1, timeout_seconds=30)
    body = b'{"instances": ["ab"]}'
    predict = f"POST /v1/models/m:predict HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
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
    time.sleep(0.5)  # decoding, on the only handler thread
    waiting = socket.create_connection(("127.0.0.1", port), timeout=30)
    waiting.sendall(predict)  # accepted; waits for the thread
    time.sleep(0.3)
    server.shutdown()  # the accept loop ends: as in stop(), before the listening socket closes
    backlog = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
    for connection in backlog:
        connection.sendall(predict)
    connections = {"in flight": in_flight, "waiting": waiting, "backlog 0": backlog[0], "backlog 1": backlog[1]}
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
    """Bodies as bytes (tests/serving/test_requests.py), through the handler: 200 or a 4xx, never a 500."""
    status, reply = request(echo_port, "POST", "/v1/models/m:predict", raw=raw, timeout=30)
    assert status == 200 or (400 <= status < 500 and isinstance(reply["error"], str)), (status, reply)

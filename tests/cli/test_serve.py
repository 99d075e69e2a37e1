"""tft-serve on 127.0.0.1: TF Serving's REST API, concurrency, limits and client mistakes, versions, shutdown."""

import concurrent.futures
import json
import shutil
import signal
import socket
import threading
import time

import pytest

from tests.serving.client import Server, raw_exchange, request, responses

NAME = "tiny_en_de"
SENTENCES = ["zeta", "alpha beta", "omega sigma kappa", ""]
MAX_RESPONSE_BYTES = 200_000


@pytest.fixture(scope="module")
def server(tiny_export):
    started = Server(
        tiny_export.parent,
        "--max_batch_size",
        "8",
        "--max_request_bytes",
        "65536",
        "--rest_api_timeout_in_ms",
        "2000",
        "--max_response_bytes",
        str(MAX_RESPONSE_BYTES),
    )
    yield started
    started.stop()


@pytest.fixture(scope="module")
def expected(server):
    status, body = server.post({"instances": SENTENCES})
    assert status == 200
    return [p["translations"] for p in body["predictions"]]


def test_status_metadata_readiness(server):
    status, body = server.get(f"/v1/models/{NAME}")
    assert status == 200 and body["model_version_status"] == [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]
    assert server.get(f"/v1/models/{NAME}/versions/1")[0] == 200
    assert server.get(f"/v1/models/{NAME}/versions/2")[0] == 404
    status, body = server.get(f"/v1/models/{NAME}/metadata")
    assert status == 200 and body["model_spec"] == {"name": NAME, "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    default = signatures["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    assert default["inputs"]["inputs"]["dtype"] == "DT_STRING"
    assert default["inputs"]["inputs"]["tensor_shape"]["dim"][0]["size"] == "-1"
    assert {k: v["dtype"] for k, v in default["outputs"].items()} == {"translations": "DT_STRING", "scores": "DT_FLOAT"}
    assert signatures["translate_ids"]["inputs"]["inputs"]["dtype"] == "DT_INT32"
    assert server.get("/readyz") == (200, {"ready": True, "models": [NAME]})
    assert server.get("/healthz")[0] == 200


def test_tf_serving_formats_under_concurrency(server, expected):
    assert expected[3] == ""
    status, columnar = server.post({"inputs": SENTENCES}, path=f"/v1/models/{NAME}/versions/1:predict")
    assert status == 200 and columnar["outputs"]["translations"] == expected

    def client(index):
        answers = []
        for step in range(25):
            pick = (index + step) % len(SENTENCES)
            code, reply = server.post({"instances": [SENTENCES[pick]]})
            answers.append(code == 200 and reply["predictions"][0]["translations"] == expected[pick])
        return answers

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = [ok for answers in pool.map(client, range(16)) for ok in answers]
    assert len(results) == 400 and results.count(False) <= 4  # merged batches: float near-ties only
    status, body = server.post({"signature_name": "translate_ids", "instances": [[9, 3], [10, 11, 3]]})
    assert status == 200 and all(isinstance(p["ids"], list) for p in body["predictions"])


@pytest.mark.parametrize(
    "body, message",
    [
        ({"instances": [1, 2]}, "takes strings"),
        ({"instances": ["a"] * 9}, "exceeds the maximum of 8"),
        ({"inputs": ["a"], "instances": ["b"]}, "exactly one"),
        ({"instances": ["a"], "signature_name": "nope"}, "Unknown signature_name"),
        ({"instances": [{"inputs": {"deep": [[[]]]}}]}, "takes strings"),
        ({"signature_name": "translate_ids", "instances": [[9, 120, 3]]}, "outside the vocabulary"),
        ({"signature_name": "translate_ids", "instances": [[9, -4, 3]]}, "outside the vocabulary"),
        ({"signature_name": "translate_ids", "instances": [["9"]]}, "integer token ids"),
        ({"signature_name": "translate_ids", "instances": [[9] * 600 + [3]]}, "maximum source length of 512"),
        ({"signature_name": "translate_ids", "instances": [[9, 3], [5] + [0] * 600]}, "input 1: 601 ids"),
        ({"instances": ["a", "zeta " * 600]}, "input 1: 601 tokens (EOS included) is longer than this model's maximum"),
        ({"instances": ["\ud800"]}, "not valid Unicode"),
    ],
)
def test_client_mistakes_are_400_with_a_reason(server, body, message):
    status, reply = server.post(body)
    assert status == 400 and message in reply["error"], reply


def test_an_overlong_sentence_fails_alone(server, expected):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        good = [pool.submit(server.post, {"instances": [SENTENCES[i % 3]]}) for i in range(5)]
        bad = pool.submit(server.post, {"instances": ["zeta alpha " * 400]})
        assert bad.result()[0] == 400
        for i, future in enumerate(good):
            status, reply = future.result()
            assert status == 200 and reply["predictions"][0]["translations"] == expected[i % 3]


def test_an_id_over_pythons_integer_digit_limit_is_400(server):
    body = b'{"signature_name": "translate_ids", "instances": [[' + b"9" * 5000 + b", 3]]}"
    status, reply = request(server.port, "POST", f"/v1/models/{NAME}:predict", raw=body)
    assert status == 400 and "Malformed JSON" in reply["error"], reply


def test_an_answer_over_max_response_bytes_is_413(server):
    """translate_with_alignment answers [target, source] floats per sentence: long sentences, a large answer."""
    long = " ".join(["alpha beta gamma delta epsilon zeta theta kappa"] * 8)
    status, reply = server.post({"signature_name": "translate_with_alignment", "instances": [long] * 8})
    assert status == 413, reply
    assert f"over this server's limit of {MAX_RESPONSE_BYTES} bytes (--max_response_bytes)" in reply["error"]
    status, reply = server.post({"signature_name": "translate_with_alignment", "instances": ["zeta"]})
    assert status == 200 and reply["predictions"][0]["translations"] is not None


def test_malformed_http(server):
    head = f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    [(status, reply)] = responses(raw_exchange(server.port, (head + "Content-Length: 10000000\r\n\r\n").encode()))
    assert status == 413 and "Maximum request body size 65536 exceeded" in reply["error"]
    # A request aiohttp cannot parse gets its plain-text 400, before any of our code sees it.
    answer = raw_exchange(server.port, (head + "Content-Length: ten\r\n\r\n").encode())
    assert answer.split()[1] == b"400" and b"Content-Length" in answer.partition(b"\r\n\r\n")[2], answer
    [(status, reply)] = responses(raw_exchange(server.port, (head + "\r\n").encode()))
    assert status == 411
    [(status, reply)] = responses(raw_exchange(server.port, (head + "Content-Length: 9\r\n\r\n{not json").encode()))
    assert status == 400 and "Malformed JSON" in reply["error"]
    assert request(server.port, "POST", f"/v1/models/{NAME}:predict", raw=b"\xff\xfe")[0] == 400


def test_keep_alive_after_404_reads_the_next_request(server):
    body = json.dumps({"instances": ["zeta"]})
    wrong = f"POST /v1/models/other:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    right = f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    last = f"GET /v1/models/{NAME} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answers = responses(raw_exchange(server.port, (wrong + right + last).encode()))
    assert [status for status, _ in answers] == [404, 200, 200]
    assert "other" in answers[0][1]["error"] and answers[1][1]["predictions"][0]["translations"] is not None


def test_a_stalled_client_is_disconnected_and_others_are_served(server, expected):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as stalled:
        stalled.sendall(b"POST /v1/models/tiny_en_de:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
        start = time.monotonic()
        status, reply = server.post({"instances": ["zeta"]})
        assert status == 200 and reply["predictions"][0]["translations"] == expected[0]
        data = b""
        while chunk := stalled.recv(1024):  # answered and closed after --rest_api_timeout_in_ms (2 s)
            data += chunk
        [(status, reply)] = responses(data)
        assert status == 408 and "did not arrive within 2 s" in reply["error"]
        assert time.monotonic() - start < 20
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as idle:  # never sends a byte
        assert idle.recv(1024) == b""  # closed, nothing to answer


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_then_exits(tiny_export):
    """A request waiting in a batch when SIGTERM arrives is answered; one accepted but waiting for the only
    handler thread is answered too (200 or 503), not dropped; then the server exits 0 and listens no more."""
    server = Server(tiny_export.parent, "--batch_timeout_micros", "3000000", "--rest_api_num_threads", "1")
    try:
        answer, queued = {}, {}
        client = threading.Thread(target=lambda: answer.update(reply=server.post({"instances": ["zeta", "alpha"]})))
        client.start()
        time.sleep(1.0)  # the request now waits for its batch (3 s), holding the only handler thread
        body = json.dumps({"instances": ["zeta"]})
        head = f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        second = threading.Thread(
            target=lambda: queued.update(data=raw_exchange(server.port, (head + body).encode(), timeout=60))
        )
        second.start()
        time.sleep(0.5)  # accepted, waiting for the thread
        server.process.send_signal(signal.SIGTERM)
        client.join(60)
        second.join(60)
        assert answer["reply"][0] == 200 and len(answer["reply"][1]["predictions"]) == 2
        [(status, reply)] = responses(queued["data"])
        assert status == 200 or (status == 503 and "stopping" in reply["error"]), (status, reply)
        assert server.process.wait(60) == 0
        with pytest.raises(OSError):
            request(server.port, "GET", f"/v1/models/{NAME}", timeout=5)
    finally:
        server.stop()


@pytest.mark.slow
def test_new_versions_are_picked_up_and_a_broken_one_is_skipped(tiny_export, tmp_path):
    base = tmp_path / NAME
    shutil.copytree(tiny_export, base / "1")
    server = Server(base, "--file_system_poll_wait_seconds", "0.2")
    try:
        status, first = server.post({"instances": SENTENCES})
        assert status == 200
        shutil.copytree(tiny_export, base / ".2.partial")
        (base / ".2.partial" / "saved_model.pb").write_bytes(b"not a graph")
        (base / ".2.partial").rename(base / "2")
        states = _wait_for_states(server, {"2": "END", "1": "AVAILABLE"})
        assert states["2"]["status"]["error_code"] == "UNKNOWN" and states["2"]["status"]["error_message"]
        assert server.post({"instances": SENTENCES}) == (200, first)  # version 1 still serves

        shutil.copytree(tiny_export, base / ".3.partial")
        (base / ".3.partial").rename(base / "3")
        _wait_for_states(server, {"3": "AVAILABLE", "2": "END", "1": "END"})
        status, third = server.post({"instances": SENTENCES}, path=f"/v1/models/{NAME}/versions/3:predict")
        assert status == 200 and third == first  # the same model under a new number
        assert server.post({"instances": SENTENCES}, path=f"/v1/models/{NAME}/versions/1:predict")[0] == 404
    finally:
        assert server.stop() == 0


def _wait_for_states(server, wanted, seconds=120):
    deadline = time.monotonic() + seconds
    while True:
        status, body = server.get(f"/v1/models/{NAME}")
        states = {row["version"]: row for row in body["model_version_status"]}
        if {version: row["state"] for version, row in states.items()} == wanted:
            return states
        assert time.monotonic() < deadline, states
        time.sleep(0.2)

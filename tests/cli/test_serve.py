"""tft-serve: TF Serving's REST API on 127.0.0.1 under concurrent clients."""

import json
import subprocess

from tests.commands import BIN


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port, method, path, body=None, raw=None):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = json.loads(response.read().decode())
    connection.close()
    return response.status, data


def test_serve_speaks_tf_serving_rest_under_concurrency(tiny_export):
    import concurrent.futures
    import time

    port = _free_port()
    server = subprocess.Popen(
        [str(BIN / "tft-serve"), "--model", str(tiny_export.parent), "--port", str(port), "--max_batch_size", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 180
        while True:
            try:
                status, body = _request(port, "GET", "/v1/models/tiny_en_de")
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()[-3000:]
                assert time.time() < deadline, "server did not start"
                time.sleep(0.5)
        assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
        assert body["model_version_status"][0]["version"] == "1"

        sentences = ["zeta", "alpha beta", "omega sigma kappa", ""]
        status, body = _request(port, "POST", "/v1/models/tiny_en_de:predict", {"instances": sentences})
        assert status == 200
        expected = [p["translations"] for p in body["predictions"]]
        assert expected[3] == ""
        status, columnar = _request(port, "POST", "/v1/models/tiny_en_de/versions/1:predict", {"inputs": sentences})
        assert status == 200 and columnar["outputs"]["translations"] == expected

        def client(index):
            answers = []
            for request in range(50):
                pick = (index + request) % len(sentences)
                code, reply = _request(port, "POST", "/v1/models/tiny_en_de:predict", {"instances": [sentences[pick]]})
                answers.append(code == 200 and reply["predictions"][0]["translations"] == expected[pick])
            return answers

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = [ok for answers in pool.map(client, range(8)) for ok in answers]
        assert len(results) == 400 and all(results)

        bad = [
            (None, b"{not json"),
            ({"instances": [1, 2]}, None),
            ({"instances": ["a"] * 9}, None),  # over --max_batch_size
            ({"inputs": ["a"], "instances": ["b"]}, None),
            ({"instances": ["a"], "signature_name": "nope"}, None),
        ]
        for body, raw in bad:
            status, reply = _request(port, "POST", "/v1/models/tiny_en_de:predict", body, raw)
            assert status == 400 and "error" in reply, (body, raw, reply)
        assert _request(port, "GET", "/v1/models/other")[0] == 404
        status, body = _request(port, "POST", "/v1/models/tiny_en_de:predict", {"instances": ["zeta"]})
        assert status == 200 and body["predictions"][0]["translations"] == expected[0]  # still serving
        status, body = _request(
            port, "POST", "/v1/models/tiny_en_de:predict", {"signature_name": "translate_ids", "instances": [[9, 3]]}
        )
        assert status == 200 and isinstance(body["predictions"][0]["ids"], list)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()

"""A bounded load of good and bad requests against a running tft-serve, shared by the test and the benchmark.

Each client sends a fixed, seeded sequence of requests over its own connections:
good sentences, and the mistakes real traffic brings (malformed JSON, wrong
types, a body over the size limit, a sentence over the length limit, a client
that disconnects halfway through its request). Every socket operation has a
timeout, so a run ends by itself.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import socket
import time

from tests.serving.client import request

KINDS = ("good", "good", "good", "good", "malformed", "wrong_type", "oversize", "overlong", "disconnect")


def _disconnect(port: int, path: str) -> None:
    body = json.dumps({"instances": ["alpha beta gamma"]}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head + body[: len(body) // 2])  # then gone


def _oversize(port: int, path: str, limit: int) -> tuple[int, dict]:
    """Announces a body over the limit and sends its start: the server answers without reading it."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {limit * 4}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head + b'{"instances": ["' + b"a" * 1000)
        data = b""
        while chunk := connection.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def run_client(port, name, sentences, overlong, max_request_bytes, requests, seed, kinds=KINDS):
    """``[(kind, sentence index or None, status, answer, seconds)]`` for one client's requests."""
    rng = random.Random(seed)
    path = f"/v1/models/{name}:predict"
    results = []
    for _ in range(requests):
        kind = rng.choice(kinds)
        index = rng.randrange(len(sentences)) if kind == "good" else None
        start = time.perf_counter()
        if kind == "good":
            status, answer = request(port, "POST", path, {"instances": [sentences[index]]})
        elif kind == "malformed":
            status, answer = request(port, "POST", path, raw=b'{"instances": ["a"')
        elif kind == "wrong_type":
            status, answer = request(port, "POST", path, {"instances": [{"inputs": [1, [2]]}]})
        elif kind == "oversize":
            status, answer = _oversize(port, path, max_request_bytes)
        elif kind == "overlong":
            status, answer = request(port, "POST", path, {"instances": [overlong]})
        else:
            _disconnect(port, path)
            status, answer = None, None
        results.append((kind, index, status, answer, time.perf_counter() - start))
    return results


def run_load(port, name, sentences, overlong, max_request_bytes, clients, requests, seed=0, kinds=KINDS):
    """Every client's results, the clients running at once."""
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [
            pool.submit(run_client, port, name, sentences, overlong, max_request_bytes, requests, seed + c, kinds)
            for c in range(clients)
        ]
        return [row for future in futures for row in future.result()]


def run_grpc_client(port, name, sentences, requests, seed):
    """``[(sentence index, translation, seconds)]`` of one gRPC client's single-sentence Predicts (one channel)."""
    import grpc
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    rng = random.Random(seed)
    results = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for _ in range(requests):
            index = rng.randrange(len(sentences))
            message = predict_pb2.PredictRequest()
            message.model_spec.name = name
            message.inputs["inputs"].CopyFrom(tf.make_tensor_proto(np.array([sentences[index].encode()], object)))
            start = time.perf_counter()
            answer = stub.Predict(message, timeout=120)
            seconds = time.perf_counter() - start
            results.append((index, answer.outputs["translations"].string_val[0].decode(), seconds))
    return results


def run_grpc_load(port, name, sentences, clients, requests, seed=0):
    """Every gRPC client's results, the clients running at once (the good requests of :func:`run_load`'s seeds)."""
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(run_grpc_client, port, name, sentences, requests, seed + c) for c in range(clients)]
        return [row for future in futures for row in future.result()]

"""Starting tft-serve in a process and talking HTTP to it, politely or not, from tests and benchmarks."""

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, raw=None, timeout=120, parse=True):
    """``(status, JSON answer)`` of one request on a new connection (``parse=False``: the answer's text)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    try:
        connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode()
        return response.status, json.loads(text) if parse else text
    finally:
        connection.close()


def raw_exchange(port, data: bytes, timeout=30) -> bytes:
    """Sends ``data`` as is and reads until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def responses(data: bytes) -> list[tuple[int, dict]]:
    """The ``(status, JSON body)`` of each HTTP response in ``data``, in order."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        length = int(headers["Content-Length"])
        found.append((int(lines[0].split()[1]), json.loads(rest[:length])))
        data = rest[length:]
    return found


def _speaks_grpc(checkout) -> bool:
    with open(os.path.join(checkout, "configs", "serving.py"), encoding="utf-8") as handle:
        return "rest_api_port" in handle.read()


class Server:
    """``tft-serve --model MODEL`` on free ports of 127.0.0.1 (REST: ``port``), waited for until ready.

    ``model=None``: the models are named in ``flags`` (``--model_config_file``).

    ``checkout``: run another checkout's tft-serve (its directory first on the
    module path) with this environment's packages, e.g. to compare versions.
    """

    def __init__(self, model, *flags, startup_seconds=180, checkout=None):
        self.name = os.path.basename(os.path.abspath(str(model))) if model is not None else None  # in URLs
        models = ["--model", os.path.abspath(str(model))] if model is not None else []
        self.port = free_port()  # REST's
        self.grpc_port = free_port()
        ports = ["--rest_api_port", str(self.port), "--port", str(self.grpc_port)]
        if checkout is not None and not _speaks_grpc(checkout):  # a checkout from before gRPC: --port was REST's
            ports, self.grpc_port = ["--port", str(self.port)], None
        self._log = tempfile.TemporaryFile()  # the server's standard error, read only if it fails to start
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        command = [os.path.join(BIN, "tft-serve")]
        if checkout is not None:
            env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(checkout), env.get("PYTHONPATH", "")]).rstrip(":")
            command = [sys.executable, "-m", "tf_transformer.cli.serve"]
        self.process = subprocess.Popen(
            [*command, *models, *ports, *flags],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=env,
            cwd=checkout,
        )
        deadline = time.monotonic() + startup_seconds
        while True:
            try:
                if request(self.port, "GET", "/readyz", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"tft-serve exited: {self.log()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("tft-serve did not become ready")
            time.sleep(0.3)

    def post(self, body, path=None, **kwargs):
        return request(self.port, "POST", path or f"/v1/models/{self.name}:predict", body, **kwargs)

    def get(self, path, **kwargs):
        return request(self.port, "GET", path, **kwargs)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def resident_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self, timeout=60) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@contextlib.contextmanager
def in_process(export, **options):
    """tft-serve's server over ``export`` in this process (``options``: ``ServingOptions`` fields), loaded."""
    import threading

    from configs.serving import ServingOptions
    from tf_transformer.serving import make_server

    options = {"port": 0, "rest_api_port": 0, "file_system_poll_wait_seconds": 0, **options}
    started = make_server(str(export), ServingOptions(**options))
    threading.Thread(target=started.serve_forever, daemon=True).start()
    try:
        assert started.versions.wait_loaded(300)
        yield started
    finally:
        started.stop()

"""Two worker processes on 127.0.0.1 train exactly like one process on the same global batches."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.corpora import write_corpus
from tf_transformer.run_dir import restore_model

BIN = pathlib.Path(sys.executable).parent


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def command(corpus, model_dir):
    return [
        str(BIN / "tft-train"),
        "--config=tiny",
        f"--data={corpus}",
        "--dev_split=",
        "--strategy=multi_worker",
        "--train_steps=4",
        "--checkpoint_every=2",
        "--tokens=512",
        "--max_length=64",
        "--vocab_size=120",
        "--set=dropout=0.0",
        f"--model_dir={model_dir}",
    ]


@pytest.mark.slow
def test_two_workers_match_one_process(tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, n=300)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"

    single = tmp_path / "single"
    done = subprocess.run(command(corpus, single), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    multi = tmp_path / "multi"
    workers = []
    try:
        for index in range(2):
            worker_env = dict(
                env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            )
            workers.append(
                subprocess.Popen(
                    command(corpus, multi),
                    env=worker_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outputs = [worker.communicate(timeout=300) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=30)
    for worker, (_, stderr) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, stderr[-3000:]

    summary = json.loads((multi / "train_summary.json").read_text())
    assert summary["replicas"] == 2 and summary["steps"] == 4
    reference, _ = restore_model(str(single))
    trained, _ = restore_model(str(multi))
    for a, b in zip(trained.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    initial = json.loads((single / "train_summary.json").read_text())["history"]["loss"]
    np.testing.assert_allclose(summary["history"]["loss"], initial, rtol=1e-4)

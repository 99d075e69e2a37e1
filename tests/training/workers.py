"""Worker processes on 127.0.0.1 for the multi-worker tests: their flags, environment, start and end."""

import json
import os
import pathlib
import subprocess
import sys

from tests.corpora import write_corpus
from tf_transformer.run_dir import restore_model
from tf_transformer.training.cluster import local_cluster

BIN = pathlib.Path(sys.executable).parent
ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 30


def flags(corpus, model_dir, *extra):
    return [
        "--config=tiny",
        f"--data={corpus}",
        "--dev_split=val",
        "--dev_bleu_sentences=5",
        f"--train_steps={STEPS}",
        "--steps_per_epoch=10",
        "--checkpoint_every=5",
        "--tokens_per_batch=512",
        "--max_train_length=64",
        "--vocab_size=120",
        "--set=dropout=0.0",
        # Layouts agree to float32 round-off only; `auto` would take mixed_bfloat16 on CPUs with a bfloat16 unit.
        "--precision=float32",
        f"--model_dir={model_dir}",
        *extra,
    ]


def environment():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    return env


def start_workers(count, argv_of):
    """``count`` worker processes; ``argv_of(index)`` gives each one's command."""
    cluster = local_cluster(count)
    workers = []
    for index in range(count):
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = dict(environment(), TF_CONFIG=json.dumps(task))
        workers.append(
            subprocess.Popen(argv_of(index), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return workers


def finish(workers, timeout=1200):
    """``[(returncode, stderr)]`` of each worker; kills all of them on the way out."""
    try:
        outputs = [worker.communicate(timeout=timeout) for worker in workers]
        return [(worker.returncode, stderr) for worker, (_, stderr) in zip(workers, outputs, strict=True)]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=30)


def write_worker_corpus(directory):
    """The corpus every multi-worker test trains on: 300 pairs, and 30 in ``val``."""
    write_corpus(directory, n=300)
    write_corpus(directory, n=30, seed=5, split="val")
    return directory


def weights(run):
    model, _ = restore_model(str(run))
    return model.get_weights()


def checkpoints(run):
    """The checkpoints' file names, by number (ckpt-5 before ckpt-45)."""
    return sorted((p.name for p in (run / "checkpoints").glob("ckpt-*.index")), key=lambda name: int(name[5:-6]))

"""Distributed training benchmark (not a test): tokens/s of each layout against one process, same global batches.

    python -m benchmarks.distributed --data ../shared/data/multi30k --src en --tgt de

Runs ``tft-train`` in four layouts on the same data, seed and global batches:
one process on one device, one process with MirroredStrategy over 2 logical CPU
devices, 2 worker processes of one device each on 127.0.0.1, and (the baseline
again) one process. Each layout trains ``--warmup`` steps, then resumes to
``--warmup + --steps`` in a new process; the tokens of those steps over the second
run's ``train_seconds`` give its throughput. That time runs from the start of
``fit`` (or of the workers' loop) to its end: it leaves out process start, model
building and the restore, but holds the second run's tracing of the train step,
its input pipeline's start and its last checkpoint. What this
measures is the cost of the distribution machinery on one CPU: every layout
shares the same cores, so a speed-up is not possible here and real multi-GPU or
multi-machine speed cannot be measured. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags

from benchmarks.common import machine
from tf_transformer.training.cluster import local_cluster

FLAGS = flags.FLAGS
flags.DEFINE_string("data", "../shared/data/multi30k", "Corpus directory holding {split}.{src} and {split}.{tgt}.")
flags.DEFINE_string("src", "en", "Source language code.")
flags.DEFINE_string("tgt", "de", "Target language code.")
flags.DEFINE_string("config", "small", "Model preset.")
flags.DEFINE_integer("tokens_per_batch", 4096, "Global token budget per batch and side.")
flags.DEFINE_integer("warmup", 5, "Steps a first run trains (making the vocabulary and data cache).")
flags.DEFINE_integer("steps", 30, "Steps measured.")

BIN = pathlib.Path(sys.executable).parent
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(layout: str, model_dir: str, steps: int) -> dict:
    """Trains ``model_dir`` up to ``steps`` in ``layout``; returns the chief's summary."""
    flags_ = [
        f"--config={FLAGS.config}",
        f"--data={FLAGS.data}",
        f"--src={FLAGS.src}",
        f"--tgt={FLAGS.tgt}",
        "--dev_split=",
        f"--tokens_per_batch={FLAGS.tokens_per_batch}",
        f"--train_steps={steps}",
        "--checkpoint_every=0",
        f"--model_dir={model_dir}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    if layout == "workers_2":
        cluster = local_cluster(2)
        workers = []
        for index in range(2):
            task = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            workers.append(
                subprocess.Popen(
                    [str(BIN / "tft-train"), "--strategy=multi_worker", *flags_],
                    env=dict(env, TF_CONFIG=task),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for worker in workers:
            _, stderr = worker.communicate()
            if worker.returncode:
                raise RuntimeError(f"{layout}: {stderr[-2000:]}")
    else:
        if layout == "mirrored_2":
            command = [sys.executable, "-m", "benchmarks.logical_devices", "2", "--strategy=mirrored", *flags_]
        else:
            command = [str(BIN / "tft-train"), "--strategy=one_device", *flags_]
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            raise RuntimeError(f"{layout}: {done.stderr[-2000:]}")
    with open(os.path.join(model_dir, "train_summary.json"), encoding="utf-8") as f:
        return json.load(f)


def _tokens(model_dir: str, first: int, last: int) -> int:
    """Target tokens of global batches ``first`` to ``last - 1`` of the run's stream."""
    import pipelines
    from tf_transformer import run_dir

    config, _ = run_dir.load_run(model_dir)
    corpus = pipelines.find_split(FLAGS.data, "train", FLAGS.src, FLAGS.tgt)
    tokenizer = pipelines.Tokenizer(run_dir.vocabulary_path(model_dir))
    data = pipelines.training_dataset(
        corpus,
        tokenizer,
        tokens_per_batch=config.tokens_per_batch,  # the run's, as config.json records them
        max_train_length=config.max_train_length,
        seed=1,
        deterministic=True,
        repeat=True,
        cache_dir=os.path.join(model_dir, "data_cache"),
    )
    batches = data.starting_at(first).take(last - first)
    return int(sum(np.count_nonzero(labels.numpy()) for _, labels in batches))


def main(argv):
    del argv
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for layout in ("one_device", "mirrored_2", "workers_2", "one_device_again"):
            model_dir = os.path.join(work, layout)
            _run(layout.removesuffix("_again"), model_dir, FLAGS.warmup)
            summary = _run(layout.removesuffix("_again"), model_dir, FLAGS.warmup + FLAGS.steps)
            tokens = _tokens(model_dir, FLAGS.warmup, FLAGS.warmup + FLAGS.steps)
            results[layout] = {
                "seconds": summary["train_seconds"],
                "tokens_per_second": tokens / summary["train_seconds"],
            }
            print(layout, json.dumps(results[layout]), flush=True)
    baseline = (results["one_device"]["tokens_per_second"] + results["one_device_again"]["tokens_per_second"]) / 2
    print(
        json.dumps(
            {
                "benchmark": "distributed",
                "machine": machine(),
                "config": FLAGS.config,
                "tokens_per_batch": FLAGS.tokens_per_batch,
                "steps": FLAGS.steps,
                "layouts": results,
                "mirrored_2_vs_one_device": round(results["mirrored_2"]["tokens_per_second"] / baseline, 3),
                "workers_2_vs_one_process": round(results["workers_2"]["tokens_per_second"] / baseline, 3),
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

"""Several layouts, one update: workers on 127.0.0.1, mirrored logical CPUs, one process; faults and resume.

MultiWorkerMirroredStrategy without GPUs gives each worker one CPU device, so
the workers here have one replica each; the cut of a global batch for several
replicas per worker is tested in ``tests/data/test_global_batches.py``.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.checkpoints import assert_identical, latest_step
from tests.corpora import write_corpus
from tf_transformer.run_dir import restore_model

BIN = pathlib.Path(sys.executable).parent
ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 30
pytestmark = pytest.mark.slow


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


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
        f"--model_dir={model_dir}",
        *extra,
    ]


def environment():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    return env


def start_workers(count, argv_of, ports=None):
    """``count`` worker processes; ``argv_of(index)`` gives each one's command."""
    ports = ports or free_ports(count)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
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


def weights(run):
    model, _ = restore_model(str(run))
    return model.get_weights()


def checkpoints(run):
    """The checkpoints' file names, by number (ckpt-5 before ckpt-45)."""
    return sorted((p.name for p in (run / "checkpoints").glob("ckpt-*.index")), key=lambda name: int(name[5:-6]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    write_corpus(directory, n=300)
    write_corpus(directory, n=30, seed=5, split="val")
    return directory


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """One process on one device: the updates every layout must make."""
    run = tmp_path_factory.mktemp("reference") / "run"
    done = subprocess.run(
        [str(BIN / "tft-train"), *flags(corpus, run)], env=environment(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def assert_same_run(run, reference, same_val_loss=True, resumed_at=None):
    for a, b in zip(weights(run), weights(reference), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)  # float reassociation across layouts only
    assert checkpoints(run) == checkpoints(reference)
    ours = json.loads((run / "train_summary.json").read_text())
    theirs = json.loads((reference / "train_summary.json").read_text())
    assert ours["steps"] == theirs["steps"] == STEPS
    # A rerun's history holds the epochs it trained; one it resumed within counts only the batches after.
    skip = 1 if resumed_at and resumed_at % 10 else 0
    keys = ["loss", "val_perplexity"] + (["val_loss"] if same_val_loss else [])
    for key in keys:
        mine = ours["history"][key][skip:]
        np.testing.assert_allclose(mine, theirs["history"][key][-len(mine) :], rtol=1e-4)
    assert ours["dev_bleu"] == pytest.approx(theirs["dev_bleu"], abs=1e-6)


def test_four_workers_and_four_mirrored_devices_make_one_process_updates(corpus, reference, tmp_path):
    mirrored = tmp_path / "mirrored"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.logical_devices", "4", "--strategy=mirrored", *flags(corpus, mirrored)],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((mirrored / "config.json").read_text())["run"]["num_replicas"] == 4
    assert_same_run(mirrored, reference, same_val_loss=False)

    multi = tmp_path / "multi"
    command = [str(BIN / "tft-train"), "--strategy=multi_worker", *flags(corpus, multi)]
    results = finish(start_workers(4, lambda index: command))
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    summary = json.loads((multi / "train_summary.json").read_text())
    assert summary["replicas"] == 4
    assert_same_run(multi, reference)
    # One vocabulary: the workers used the chief's, and trained none of their own.
    assert not list(multi.glob(".worker-*/sp.model"))
    assert (multi / "logs" / "validation").is_dir()


def test_a_killed_worker_stops_the_other_and_a_rerun_resumes(corpus, reference, tmp_path):
    multi = tmp_path / "multi"
    command = [str(BIN / "tft-train"), "--strategy=multi_worker", "--worker_timeout=60", *flags(corpus, multi)]
    workers = start_workers(2, lambda index: command)
    try:
        deadline = time.monotonic() + 300
        while not (multi / "checkpoints" / "ckpt-5.index").exists():
            assert time.monotonic() < deadline and workers[0].poll() is None, "no checkpoint written"
            time.sleep(0.05)
        workers[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        (code, stderr), _ = finish(workers, timeout=180)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert code not in (0, None) and time.monotonic() - killed_at < 180
    assert "lost contact with the other workers" in stderr and "run every worker's command again" in stderr, stderr[
        -3000:
    ]
    latest = tf.train.latest_checkpoint(str(multi / "checkpoints"))
    assert 5 <= int(latest.rsplit("-", 1)[1]) < STEPS  # killed before the end: the rerun has steps left

    for code, stderr in finish(start_workers(2, lambda index: command)):
        assert code == 0, stderr[-3000:]
    assert_same_run(multi, reference, resumed_at=int(latest.rsplit("-", 1)[1]))


def test_a_worker_that_cannot_see_the_chiefs_model_dir_stops_with_an_error(corpus, tmp_path):
    def command(index):
        own = tmp_path / ("shared" if index == 0 else "local")  # worker 1 does not see the chief's directory
        return [str(BIN / "tft-train"), "--strategy=multi_worker", "--worker_timeout=15", *flags(corpus, own)]

    start = time.monotonic()
    (chief_code, chief_err), (code, stderr) = finish(start_workers(2, command), timeout=300)
    assert code not in (0, None) and chief_code not in (0, None)
    assert "shared filesystem" in stderr and str(tmp_path / "local") in stderr, stderr[-3000:]
    assert not (tmp_path / "local" / "sp.model").exists()  # no vocabulary of its own
    assert "lost contact with the other workers" in chief_err, chief_err[-3000:]
    assert time.monotonic() - start < 300


def test_a_time_budget_stops_every_worker_after_the_same_step(corpus, tmp_path):
    multi = tmp_path / "multi"

    def command(index):  # the workers' clocks disagree: one of them asks to stop much earlier
        budget = "0.05" if index == 1 else "30"
        return [
            str(BIN / "tft-train"),
            "--strategy=multi_worker",
            f"--max_minutes={budget}",
            *flags(corpus, multi, "--train_steps=100000"),
        ]

    results = finish(start_workers(2, command))
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    chief = json.loads((multi / "train_summary.json").read_text())
    other = json.loads((multi / ".worker-1" / "train_summary.json").read_text())
    assert chief["steps"] == other["steps"] < 100000
    assert checkpoints(multi)[-1] == f"ckpt-{chief['steps']}.index"


def test_early_stopping_stops_every_worker_after_the_same_evaluation(corpus, tmp_path):
    """Weights that do not move (a learning rate of 0) keep the validation loss: the first evaluation (step 3)
    is the best and patience 1 stops both workers at the second (step 6). Every worker saves the best weights
    (saving runs collectives), only the chief names them in best.json; both exit as a finished run does."""
    run = tmp_path / "multi"
    extra = ["--set=learning_rate_scale=0", "--keep_best_by=loss", "--early_stopping=1", "--steps_per_epoch=3"]
    extra += ["--dev_bleu_sentences=0", "--checkpoint_every=0"]
    command = [str(BIN / "tft-train"), "--strategy=multi_worker", *flags(corpus, run, *extra)]
    for code, stderr in finish(start_workers(2, lambda index: command)):
        assert code == 0, stderr[-3000:]
    summaries = [json.loads((path / "train_summary.json").read_text()) for path in (run, run / ".worker-1")]
    for summary in summaries:
        assert summary["stopped_by"] == "early_stopping" and summary["steps"] == 6
        assert summary["best"]["step"] == 3 and summary["best"]["evaluations_since_best"] == 1
    assert json.loads((run / "best.json").read_text())["checkpoint"] == "best/ckpt-3"
    assert (run / ".worker-1" / "best" / "ckpt-3.index").exists()
    assert not (run / ".worker-1" / "best.json").exists()
    assert checkpoints(run) == ["ckpt-3.index", "ckpt-6.index"]


def test_a_worker_started_with_other_options_than_the_chief_is_refused_and_all_stop(corpus, tmp_path):
    multi = tmp_path / "multi"

    def command(index):
        extra = ["--train_steps=31", "--checkpoint_every=4", "--set=dropout=0.1"] if index == 1 else []
        return [str(BIN / "tft-train"), "--strategy=multi_worker", "--worker_timeout=60", *flags(corpus, multi), *extra]

    start = time.monotonic()
    (chief_code, chief_err), (code, stderr) = finish(start_workers(2, command), timeout=300)
    assert code not in (0, None) and chief_code not in (0, None)
    for named in (
        "--train_steps 30 on the chief, 31 here",
        "--checkpoint_every 5 on the chief, 4 here",
        "--set dropout 0.0 on the chief, 0.1 here",
    ):
        assert named in stderr, stderr[-3000:]
    assert "were started with options other than the chief's" in chief_err, chief_err[-3000:]
    assert not (multi / "checkpoints").exists() or not checkpoints(multi)  # refused before any step
    assert time.monotonic() - start < 300


# --- faults with dropout on and --accumulate_steps 2 ---------------------------------------------------------------

FAULT_STEPS = 12  # 24 micro-batches; epochs of 5 end mid-update: epoch checkpoints 2, 5, 7, 10; every 4: 4, 8, 12


def fault_flags(corpus, model_dir):
    """Dropout on (the preset's 0.1), two micro-batches an update, epochs of an odd number of micro-batches."""
    replaced = ("--set=dropout", "--train_steps", "--steps_per_epoch", "--checkpoint_every")
    common = [f for f in flags(corpus, model_dir) if not f.startswith(replaced)]
    steps = [f"--train_steps={FAULT_STEPS}", "--steps_per_epoch=5", "--checkpoint_every=4"]
    return [*common, *steps, "--accumulate_steps=2"]


def fault_command(corpus, model_dir):
    return [str(BIN / "tft-train"), "--strategy=multi_worker", "--worker_timeout=60", *fault_flags(corpus, model_dir)]


def wait_for_checkpoint(run, step, workers):
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / f"ckpt-{step}.index").exists():
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers), "no checkpoint written"
        time.sleep(0.02)


def rerun(corpus, run):
    for code, stderr in finish(start_workers(2, lambda index: fault_command(corpus, run))):
        assert code == 0, stderr[-3000:]


@pytest.fixture(scope="module")
def fault_reference(corpus, tmp_path_factory):
    """Two workers, uninterrupted: dropout masks are drawn per worker, so the reference is two workers too."""
    run = tmp_path_factory.mktemp("fault_reference") / "run"
    for code, stderr in finish(start_workers(2, lambda index: fault_command(corpus, run))):
        assert code == 0, stderr[-3000:]
    return run


def test_two_workers_killed_between_checkpoints_resume_every_tensor(corpus, fault_reference, tmp_path):
    run = tmp_path / "multi"
    workers = start_workers(2, lambda index: fault_command(corpus, run))
    try:
        wait_for_checkpoint(run, 5, workers)  # the epoch's checkpoint in the middle of update 6
        time.sleep(0.1)
        workers[1].send_signal(signal.SIGKILL)
        (code, stderr), _ = finish(workers, timeout=180)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert code not in (0, None) and "lost contact with the other workers" in stderr, stderr[-3000:]
    landed = latest_step(run)
    assert 5 <= landed < FAULT_STEPS, "the kill landed after the last checkpoint: nothing was resumed"
    rerun(corpus, run)
    assert_identical(run, fault_reference, FAULT_STEPS)


def test_sigterm_to_one_worker_saves_one_boundary_on_all_and_the_rerun_is_exact(corpus, fault_reference, tmp_path):
    run = tmp_path / "multi"
    workers = start_workers(2, lambda index: fault_command(corpus, run))
    try:
        wait_for_checkpoint(run, 4, workers)
        workers[1].send_signal(signal.SIGTERM)
        results = finish(workers, timeout=180)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for code, stderr in results:
        assert code == 128 + signal.SIGTERM, stderr[-3000:]
    chief = json.loads((run / "train_summary.json").read_text())
    other = json.loads((run / ".worker-1" / "train_summary.json").read_text())
    assert chief["stopped_by"] == other["stopped_by"] == "SIGTERM"
    assert chief["steps"] == other["steps"] == latest_step(run) < FAULT_STEPS  # one boundary, saved by all
    assert tf.train.latest_checkpoint(str(run / ".worker-1" / "checkpoints")).endswith(f"ckpt-{chief['steps']}")
    rerun(corpus, run)
    assert_identical(run, fault_reference, FAULT_STEPS)


def test_a_damaged_newest_checkpoint_is_passed_over_by_every_worker(corpus, fault_reference, tmp_path):
    run = tmp_path / "multi"
    shorter = [*fault_command(corpus, run), "--train_steps=8"]  # ends with ckpt-8; ckpt-7 is the epoch's, mid-update
    for code, stderr in finish(start_workers(2, lambda index: shorter)):
        assert code == 0, stderr[-3000:]
    assert latest_step(run) == 8
    for data in (run / "checkpoints").glob("ckpt-8.data-*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    results = finish(start_workers(2, lambda index: fault_command(corpus, run)))
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    assert "ckpt-7" in results[0][1] and "Resumed from" in results[0][1]
    assert_identical(run, fault_reference, FAULT_STEPS)


@pytest.mark.parametrize("where", ["refused_model_dir", "vocabulary"])
def test_a_chief_that_stops_before_preparing_stops_the_others_within_seconds(corpus, tmp_path, where):
    """Before the workers' first collective (the chief refuses --model_dir), or after it, while the chief takes
    the vocabulary (an unreadable sp.model): the other worker stops within seconds, saying so."""
    from configs import get_config
    from tf_transformer import run_dir

    run = tmp_path / "multi"
    run.mkdir()
    if where == "refused_model_dir":
        run_dir.save_run(str(run), get_config("small"), {})  # another model: the chief refuses it and exits
    else:
        (run / "sp.model").write_bytes(b"not a SentencePiece model")  # only the chief reads it, then fails
    command = [str(BIN / "tft-train"), "--strategy=multi_worker", "--worker_timeout=600", *flags(corpus, run)]
    start = time.monotonic()
    (chief_code, chief_err), (code, stderr) = finish(start_workers(2, lambda index: command), timeout=300)
    assert chief_code not in (0, None), chief_err[-3000:]
    assert code not in (0, None)
    assert "the chief (worker 0)" in stderr and "stopped before" in stderr, stderr[-3000:]
    assert "shared filesystem" not in stderr
    assert time.monotonic() - start < 120  # not --worker_timeout's 600 s
    assert not (run / "cluster.json").exists()


def test_a_signal_during_validation_stops_every_worker_before_dev_bleu(corpus, tmp_path):
    run = tmp_path / "multi"

    def command(index):
        signalled = [sys.executable, "-m", "tests.training.signal_in_validation"]
        program = signalled if index == 1 else [str(BIN / "tft-train")]
        return [*program, "--strategy=multi_worker", "--worker_timeout=60", *fault_flags(corpus, run)]

    results = finish(start_workers(2, command))
    for code, stderr in results:
        assert code == 128 + signal.SIGTERM, stderr[-3000:]
    chief = json.loads((run / "train_summary.json").read_text())
    assert chief["stopped_by"] == "SIGTERM"
    assert chief["steps"] == latest_step(run) == 2  # the first epoch's end (5 micro-batches): its checkpoint
    assert chief["dev_bleu"] is None  # stopped before the epoch's dev BLEU
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / "ckpt-2"))
    assert int(reader.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE")) == 5


def test_two_workers_in_mixed_float16_agree_on_every_overflow(corpus, tmp_path):
    """The loss scale starts at 2**26, so updates overflow and are skipped; each worker holds half of every
    batch, so an overflow may show on one only. One verdict from the summed gradients: both workers skip the
    same updates and end with the same tensors (a worker that applied an update the other skipped would not)."""
    run = tmp_path / "multi"
    harness = [sys.executable, "-m", "tests.training.high_loss_scale", "--strategy=multi_worker"]
    command = [*harness, "--precision=mixed_float16", *flags(corpus, run, "--train_steps=6", "--accumulate_steps=2")]
    for code, stderr in finish(start_workers(2, lambda index: command)):
        assert code == 0, stderr[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == 6
    chief = tf.train.load_checkpoint(str(run / "checkpoints" / "ckpt-6"))
    other = tf.train.load_checkpoint(str(run / ".worker-1" / "checkpoints" / "ckpt-6"))
    assert int(chief.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE")) > 12, "no update was skipped"
    names = [n for n in chief.get_variable_to_shape_map() if not n.startswith(("save_counter", "_CHECKPOINTABLE"))]
    assert sorted(names) == sorted(n for n in other.get_variable_to_shape_map() if n in names)
    for name in names:
        value = chief.get_tensor(name)
        np.testing.assert_array_equal(other.get_tensor(name), value, err_msg=name)
        if value.dtype.kind == "f":
            assert np.isfinite(value).all(), name


def test_two_workers_train_a_parser_to_the_one_process_weights_and_dev_f1(tmp_path, monkeypatch):
    """The task changes the data, not the layouts: a parsing run (trees as text, symbols in the vocabulary,
    dev F1 by the chief's greedy search) on two worker processes makes the one-process updates."""
    from tests.corpora import write_treebank

    monkeypatch.setenv("TFT_TEXT_CACHE", str(tmp_path / "text_cache"))  # the workers inherit it
    write_treebank(tmp_path / "mrg", files=3, trees=30)

    def command(run, *extra):
        argv = flags(tmp_path / "mrg", run, "--train_steps=10", "--steps_per_epoch=5", *extra)
        parser = [
            "--task=parsing",
            "--linearization=words",
            "--train_split=wsj_0001-wsj_0002",
            "--dev_split=wsj_0003",
            "--set=max_extra_length=8",
        ]
        return [str(BIN / "tft-train"), *(a for a in argv if a != "--dev_split=val"), *parser]

    done = subprocess.run(command(tmp_path / "one"), env=environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for code, stderr in finish(start_workers(2, lambda index: command(tmp_path / "multi", "--strategy=multi_worker"))):
        assert code == 0, stderr[-3000:]
    for a, b in zip(weights(tmp_path / "multi"), weights(tmp_path / "one"), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    ours, theirs = (json.loads((tmp_path / name / "train_summary.json").read_text()) for name in ("multi", "one"))
    assert ours["steps"] == theirs["steps"] == 10
    assert ours["dev_f1"] == pytest.approx(theirs["dev_f1"], abs=1e-6)

"""Workers on 127.0.0.1 that fail: killed, signalled, a damaged checkpoint; the rerun resumes every tensor.

Dropout is on and ``--accumulate_steps 2``, with epochs of an odd number of micro-batches, so checkpoints are
also written in the middle of an update; dropout masks are drawn per worker, so the reference is two workers too.
"""

import json
import signal
import sys
import time

import pytest
import tensorflow as tf

from tests.checkpoints import assert_identical, latest_step
from tests.training.workers import BIN, checkpoints, finish, flags, start_workers, write_worker_corpus

pytestmark = pytest.mark.slow

FAULT_STEPS = 12  # 24 micro-batches; epochs of 5 end mid-update: epoch checkpoints 2, 5, 7, 10; every 4: 4, 8, 12


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_worker_corpus(tmp_path_factory.mktemp("corpus"))


def fault_flags(corpus, model_dir):
    """Dropout on (the preset's 0.1), two micro-batches an update, epochs of an odd number of micro-batches."""
    replaced = ("--set=dropout", "--train_steps", "--steps_per_epoch", "--checkpoint_every")
    common = [f for f in flags(corpus, model_dir) if not f.startswith(replaced)]
    steps = [f"--train_steps={FAULT_STEPS}", "--steps_per_epoch=5", "--checkpoint_every=4"]
    return [*common, *steps, "--accumulate_steps=2"]


def fault_command(corpus, model_dir):
    return [str(BIN / "tft-train"), "--strategy=multi_worker", "--worker_timeout=60", *fault_flags(corpus, model_dir)]


def wait_for_checkpoint(run, step, workers):
    deadline = time.monotonic() + 600
    while not (run / "checkpoints" / f"ckpt-{step}.index").exists():
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers), "no checkpoint written"
        time.sleep(0.02)


def rerun(corpus, run):
    results = finish(start_workers(2, lambda index: fault_command(corpus, run)))
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    return results


@pytest.fixture(scope="module")
def fault_reference(corpus, tmp_path_factory):
    """Two workers, uninterrupted."""
    run = tmp_path_factory.mktemp("fault_reference") / "run"
    rerun(corpus, run)
    return run


def test_a_killed_worker_stops_the_other_and_the_rerun_resumes_every_tensor(corpus, fault_reference, tmp_path):
    run = tmp_path / "multi"
    workers = start_workers(2, lambda index: fault_command(corpus, run))
    try:
        wait_for_checkpoint(run, 5, workers)  # the epoch's checkpoint in the middle of update 6
        time.sleep(0.1)
        workers[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        (code, stderr), _ = finish(workers, timeout=300)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert code not in (0, None) and time.monotonic() - killed_at < 300
    assert "lost contact with the other workers" in stderr and "run every worker's command again" in stderr, stderr[
        -3000:
    ]
    landed = latest_step(run)
    assert 5 <= landed < FAULT_STEPS, "the kill landed after the last checkpoint: nothing was resumed"
    rerun(corpus, run)
    assert_identical(run, fault_reference, FAULT_STEPS)


def test_sigterm_to_one_worker_saves_one_boundary_on_all_and_a_damaged_one_is_passed_over(
    corpus, fault_reference, tmp_path
):
    """SIGTERM to one worker: every worker saves the same boundary and stops. That checkpoint is then damaged
    (its data cut in half): every worker of the rerun passes over it to the one before, and the run ends
    with every tensor of the uninterrupted one."""
    run = tmp_path / "multi"
    workers = start_workers(2, lambda index: fault_command(corpus, run))
    try:
        wait_for_checkpoint(run, 4, workers)
        workers[1].send_signal(signal.SIGTERM)
        results = finish(workers, timeout=300)
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

    listed = checkpoints(run)
    assert len(listed) >= 2, listed
    for data in (run / "checkpoints").glob(f"ckpt-{chief['steps']}.data-*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    results = rerun(corpus, run)
    previous = listed[-2].removesuffix(".index")
    assert previous in results[0][1] and "Resumed from" in results[0][1], results[0][1][-3000:]
    assert_identical(run, fault_reference, FAULT_STEPS)


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

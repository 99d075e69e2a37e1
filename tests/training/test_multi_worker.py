"""Several layouts, one update: workers on 127.0.0.1, mirrored logical CPUs, one process; a cluster's
refusals and stops. Faults and resume: ``test_multi_worker_faults.py``.

MultiWorkerMirroredStrategy without GPUs gives each worker one CPU device, so
the workers here have one replica each; the cut of a global batch for several
replicas per worker is tested in ``tests/data/test_global_batches.py``.
"""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.training.workers import (
    BIN,
    ROOT,
    STEPS,
    checkpoints,
    environment,
    finish,
    flags,
    start_workers,
    weights,
    write_worker_corpus,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_worker_corpus(tmp_path_factory.mktemp("corpus"))


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


def test_a_budget_schedule_takes_the_least_horizon_on_every_worker(corpus, tmp_path):
    """--schedule budget under --max_minutes: each worker measures its own speed over the warmup and all
    decay to the least estimate, the one of the budget that ends first (worker 1's 1.5 minutes, not the
    chief's 30), and stop after the same step."""
    multi = tmp_path / "multi"

    def command(index):
        return [
            str(BIN / "tft-train"),
            "--strategy=multi_worker",
            f"--max_minutes={30 if index == 0 else 1.5}",
            "--schedule=budget",
            "--set=warmup_steps=4",
            *flags(corpus, multi, "--train_steps=100000"),
        ]

    results = finish(start_workers(2, command))
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    chief = json.loads((multi / "train_summary.json").read_text())
    other = json.loads((multi / ".worker-1" / "train_summary.json").read_text())
    assert 20 < chief["schedule_horizon"] == other["schedule_horizon"] < 100000  # estimated at update 20
    assert chief["steps"] == other["steps"] <= chief["schedule_horizon"]


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


def test_two_workers_in_mixed_float16_agree_on_every_overflow(corpus, tmp_path):
    """The loss scale starts at 2**26, so updates overflow and are skipped; each worker holds half of every
    batch, so an overflow may show on one only. One verdict from the summed gradients: both workers skip the
    same updates and end with the same tensors (a worker that applied an update the other skipped would not)."""
    run = tmp_path / "multi"
    harness = [sys.executable, "-m", "tests.training.high_loss_scale", "--strategy=multi_worker"]
    command = [*harness, *flags(corpus, run, "--train_steps=6", "--accumulate_steps=2", "--precision=mixed_float16")]
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

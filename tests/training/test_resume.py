"""Exact resume: a run killed (SIGKILL) or preempted (SIGTERM, SIGINT) and rerun with the same command
ends with the checkpoint an uninterrupted run writes, bit for bit, dropout on (the preset's 0.1)."""

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from tests.checkpoints import assert_identical, latest_step

BIN = pathlib.Path(sys.executable).parent
STEPS = 24
EVERY = 8


def _command(corpus, model_dir, precision, accumulate):
    return [
        str(BIN / "tft-train"),
        "--config=tiny",
        f"--data={corpus}",
        "--dev_split=",
        f"--train_steps={STEPS}",
        f"--checkpoint_every={EVERY}",
        "--keep_checkpoints=20",
        "--tokens_per_batch=512",
        "--max_train_length=64",
        "--vocab_size=120",
        f"--precision={precision}",
        f"--accumulate_steps={accumulate}",
        f"--model_dir={model_dir}",
    ]


def _run(command):
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _interrupt(command, model_dir, after_step: int, delay: float, sig=signal.SIGKILL):
    """Starts ``command`` and sends ``sig`` ``delay`` seconds after checkpoint ``after_step`` is listed."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and latest_step(model_dir) < after_step and process.poll() is None:
            time.sleep(0.02)
        time.sleep(delay)
        process.send_signal(sig)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert latest_step(model_dir) < STEPS, "the run ended before it was interrupted: nothing was tested"
    return process.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize(
    "precision, accumulate",
    # Each precision once and accumulation in the two the optimizer's state differs most between. The plain
    # float32 run without accumulation is killed and resumed in the tests of signals below and in test_training.
    [("float32", 2), ("mixed_bfloat16", 1), ("mixed_float16", 2)],
)
def test_killed_twice_and_rerun_ends_bit_identical(tmp_path, train_corpus_dir, precision, accumulate):
    """Killed once between checkpoints and once as a checkpoint appears; every tensor of the final
    checkpoint (weights, Adam moments, accumulators, loss scale, dropout seeds) equals the reference's."""
    reference = tmp_path / "reference"
    _run(_command(train_corpus_dir, reference, precision, accumulate))
    run = tmp_path / "run"
    command = _command(train_corpus_dir, run, precision, accumulate)
    code, _, _ = _interrupt(command, run, after_step=EVERY, delay=0.15)  # between checkpoints
    assert code == -signal.SIGKILL
    code, _, _ = _interrupt(command, run, after_step=2 * EVERY, delay=0.0)  # as a checkpoint is written
    assert code == -signal.SIGKILL
    resumed = _run(command)
    assert "Resumed from" in resumed.stderr
    assert_identical(run, reference, STEPS)


@pytest.mark.slow
def test_a_budget_schedule_killed_mid_decay_resumes_bit_identical(tmp_path, train_corpus_dir):
    """--schedule budget with a warmup of 8: killed between checkpoints as the rate decays, the rerun follows
    the same curve (its horizon, 24, is in the checkpoint) and ends as the uninterrupted run."""
    budget = ["--schedule=budget", "--set=warmup_steps=8"]
    reference = tmp_path / "reference"
    _run(_command(train_corpus_dir, reference, "float32", 1) + budget)
    run = tmp_path / "run"
    command = _command(train_corpus_dir, run, "float32", 1) + budget
    code, _, _ = _interrupt(command, run, after_step=2 * EVERY, delay=0.15)
    assert code == -signal.SIGKILL
    _run(command)
    assert_identical(run, reference, STEPS)
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / f"ckpt-{STEPS}"))
    horizon = [name for name in reader.get_variable_to_shape_map() if name.startswith("schedule_horizon/")]
    assert horizon and reader.get_tensor(horizon[0]) == STEPS
    assert json.loads((run / "train_summary.json").read_text())["schedule_horizon"] == STEPS


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_preempted_run_checkpoints_exits_and_resumes_bit_identical(tmp_path, train_corpus_dir, sig):
    """SIGTERM (a preemptible VM, a Kubernetes eviction) or SIGINT (Ctrl-C): a checkpoint at the next
    step boundary, exit status 128 + the signal's number, and a rerun that ends as an uninterrupted run."""
    reference = tmp_path / "reference"
    _run(_command(train_corpus_dir, reference, "float32", 2))
    run = tmp_path / "run"
    command = _command(train_corpus_dir, run, "float32", 2)
    code, out, err = _interrupt(command, run, after_step=EVERY, delay=0.15, sig=sig)
    assert code == 128 + sig, err[-3000:]
    stopped_at = latest_step(run)
    assert stopped_at > EVERY and stopped_at % EVERY, "no checkpoint at the step the signal arrived"
    assert f"ckpt-{stopped_at}" in err and signal.Signals(sig).name in err
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["stopped_by"] == signal.Signals(sig).name and summary["steps"] == stopped_at
    _run(command)
    assert_identical(run, reference, STEPS)


@pytest.mark.slow
def test_skipped_mixed_float16_steps_count_as_data_taken(tmp_path, corpus_dir, monkeypatch):
    """A float16 step whose gradients overflow is skipped (the loss scale halves) without moving the
    optimizer's step, but its batch was used: the resume point is the data's own count."""
    import keras
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    from tests.corpora import tiny_config, tiny_options
    from tf_transformer.training.trainer import train

    original = LossScaleOptimizer.__init__

    def start_high(self, inner_optimizer, initial_scale=2.0**15, **kwargs):  # overflows for the first steps
        original(self, inner_optimizer, initial_scale=2.0**26, **kwargs)

    monkeypatch.setattr(LossScaleOptimizer, "__init__", start_high)
    reference, run = tmp_path / "reference", tmp_path / "run"
    options = tiny_options(corpus_dir, precision="mixed_float16", checkpoint_every=3)
    assert train(tiny_config(train_steps=6), options, str(reference))["steps"] == 6  # the skipped steps are made up
    train(tiny_config(train_steps=3), options, str(run))
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / "ckpt-3"))
    position = int(reader.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE"))
    assert position > 3, "no step was skipped: the test needs a higher initial loss scale"
    keras.config.set_dtype_policy("float32")
    train(tiny_config(train_steps=6), options, str(run))
    assert_identical(run, reference, 6)


@pytest.mark.slow
def test_mirrored_accumulation_killed_after_a_mid_update_epoch_checkpoint_resumes_exactly(tmp_path, train_corpus_dir):
    """2 logical devices, ``--accumulate_steps 2``, epochs of 5 micro-batches: the epoch's checkpoint falls
    between the two micro-batches of an update, where every replica's accumulator must be in it. Killed
    after that checkpoint, the rerun ends with every tensor of the uninterrupted run's."""
    steps = 12  # 24 micro-batches; epoch ends at micro-batches 5, 10, 15, 20 → ckpt-2, 5, 7, 10

    def command(model_dir):
        train = _command(train_corpus_dir, model_dir, "float32", 2)
        train = [arg for arg in train[1:] if not arg.startswith(("--train_steps", "--checkpoint_every"))]
        flags = [f"--train_steps={steps}", "--checkpoint_every=1000", "--steps_per_epoch=5", "--strategy=mirrored"]
        return [sys.executable, "-m", "benchmarks.logical_devices", "2", *train, *flags]

    reference = tmp_path / "reference"
    _run(command(reference))
    run = tmp_path / "run"
    code, _, _ = _interrupt(command(run), run, after_step=7, delay=0.3)
    assert code == -signal.SIGKILL
    assert latest_step(run) == 7, "the kill did not land after the mid-update checkpoint ckpt-7"
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / "ckpt-7"))
    assert int(reader.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE")) == 15  # mid-update: 7 × 2 + 1
    resumed = _run(command(run))
    assert "Resumed from" in resumed.stderr and "ckpt-7" in resumed.stderr
    assert_identical(run, reference, steps)


@pytest.mark.slow
def test_a_signal_during_validation_stops_it_with_the_epochs_checkpoint(tmp_path, train_corpus_dir, monkeypatch):
    """SIGTERM while ``fit`` validates: validation ends at its batch, the epoch's checkpoint (mid-update here) is
    written, dev BLEU is not computed, and the run stops as preempted."""
    import os

    from tests.corpora import tiny_config, tiny_options
    from tf_transformer.training.callbacks import StopRequests
    from tf_transformer.training.trainer import train

    original = StopRequests.on_test_batch_end
    batches = []

    def signalled(self, batch, logs=None):
        batches.append(batch)
        if not self.received:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered to this, the main, thread before the next line
        original(self, batch, logs)

    monkeypatch.setattr(StopRequests, "on_test_batch_end", signalled)
    options = tiny_options(
        train_corpus_dir, dev_split="val", dev_bleu_sentences=5, steps_per_epoch=5, accumulate_steps=2
    )
    summary = train(tiny_config(train_steps=12), options, str(tmp_path / "run"))
    assert batches == [0]  # validation stopped at its first batch
    assert summary["stopped_by"] == "SIGTERM" and summary["dev_bleu"] is None
    assert summary["steps"] == 2 and latest_step(tmp_path / "run") == 2
    reader = tf.train.load_checkpoint(str(tmp_path / "run" / "checkpoints" / "ckpt-2"))
    assert int(reader.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE")) == 5  # the first epoch, mid-update

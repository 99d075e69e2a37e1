"""tft-train as a new user sees it: clean start-up, progress toward the real end, honest metrics."""

import json
import re
import subprocess

import pytest

from tests.commands import BIN


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--epochs=2", "--train_steps=5"], ["--epochs", "--train_steps"]),
        (["--epochs=2", "--set=train_steps=5"], ["--epochs", "--set train_steps"]),
        (
            ["--tokens_per_batch=512", "--set=tokens_per_batch=1024"],
            ["--tokens_per_batch 512", "--set tokens_per_batch"],
        ),
        (["--vocab_size=120", "--set=vocab_size=200"], ["--vocab_size 120", "--set vocab_size"]),
    ],
    ids=["epochs_and_train_steps", "epochs_and_set_train_steps", "flag_and_set", "vocab_size_and_set"],
)
def test_settings_given_twice_are_a_usage_error_naming_both(corpus_dir, tmp_path, flags, named):
    """A run setting is a config field: its flag and --set of it, or --epochs and a step count, are one too many.
    Refused before anything is written, with exit status 1 and no traceback."""
    model_dir = tmp_path / "run"
    command = [str(BIN / "tft-train"), "--config=tiny", f"--data={corpus_dir}", f"--model_dir={model_dir}", *flags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    message = next(line for line in result.stderr.splitlines() if "give one" in line)
    assert all(name in message for name in named), message
    assert "Traceback" not in result.stderr and not model_dir.exists()


@pytest.mark.slow
def test_a_run_reads_clean_and_counts_toward_its_end(train_corpus_dir, tmp_path):
    model_dir = tmp_path / "run"
    result = subprocess.run(
        [str(BIN / "tft-train"), "--config=tiny", f"--data={train_corpus_dir}", f"--model_dir={model_dir}"]
        + [
            "--train_steps=30",
            "--max_minutes=30",
            "--tokens_per_batch=512",
            "--max_train_length=64",
            "--vocab_size=120",
        ]
        + ["--dev_bleu_sentences=5", "--checkpoint_every=0"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # No error-looking or per-epoch warning lines (absl INFO lines are the run's own log).
    noise = [line for line in result.stderr.splitlines() if re.match(r"[EW]\d{4}|.*(Warning|WARNING)", line)]
    assert not noise, noise
    assert "ran out of data" not in result.stderr and "Epoch 1/" not in result.stdout
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) >= 2 and "step 30/30" in epochs[-1] and "/30 min" in epochs[-1] and "val_bleu" in epochs[-1]
    history = json.loads((model_dir / "train_summary.json").read_text())["history"]
    # Each metric is its own: the validation count is the dev split's, not a copy of the training count.
    assert history["val_target_tokens"][0] < history["target_tokens"][0]
    assert len(set(history["val_target_tokens"])) == 1  # the same dev split every epoch

"""tft-train as a new user sees it: clean start-up, progress toward the real end, honest metrics."""

import json
import re
import subprocess

import pytest

from tests.commands import BIN


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

"""Resume keeps the run's data stream and schedule; ``init_from`` starts a new schedule from a run's weights."""

import json

import numpy as np
import pytest

from tests.corpora import tiny_config, tiny_options, write_corpus
from tf_transformer.run_dir import load_run, restore_model, vocabulary_path
from tf_transformer.training.resume import ResumeError
from tf_transformer.training.trainer import train

pytestmark = pytest.mark.slow  # each test trains


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, corpus_dir):
    run = tmp_path_factory.mktemp("first") / "run"
    train(tiny_config(train_steps=2), tiny_options(corpus_dir), str(run))
    return run


def test_resume_refuses_changed_options_naming_old_and_new_values(first_run, corpus_dir):
    before = (first_run / "config.json").read_text()
    changed = tiny_options(corpus_dir, seed=2, accumulate_steps=2, schedule="budget")
    with pytest.raises(ResumeError) as error:
        train(tiny_config(train_steps=4, tokens_per_batch=1024, vocab_size=100), changed, str(first_run))
    message = str(error.value)
    assert "--tokens_per_batch 512 → 1024" in message
    assert "--vocab_size 120 → 100" in message  # the size asked, whatever the vocabulary made of it
    assert "--seed 1 → 2" in message
    assert "--accumulate_steps 1 → 2" in message
    assert "--schedule paper → budget" in message
    assert "--max_train_length" not in message and "--init_from" in message
    assert (first_run / "config.json").read_text() == before  # the evidence is kept


def test_resume_accepts_what_does_not_change_the_stream(first_run, corpus_dir, tmp_path):
    """More steps, then epochs instead, another precision or checkpoint cadence, the data named by another
    path: a resume."""
    link = tmp_path / "same_corpus"
    link.symlink_to(corpus_dir)
    options = tiny_options(link, checkpoint_every=1, precision="mixed_bfloat16")
    summary = train(tiny_config(train_steps=3), options, str(first_run))
    assert summary["steps"] == 3
    config, run = load_run(str(first_run))
    assert run["num_replicas"] == 1 and config.train_steps == 3
    summary = train(tiny_config(), tiny_options(corpus_dir, epochs=2), str(first_run))  # 2 epochs of 4 steps
    assert summary["steps"] == 8


def test_init_from_takes_the_weights_and_vocabulary_and_starts_at_step_0(first_run, tmp_path):
    new_data = tmp_path / "new_corpus"
    write_corpus(new_data, n=200, seed=9)
    source, _ = restore_model(str(first_run))
    run = tmp_path / "fine_tuned"
    options = tiny_options(new_data, init_from=str(first_run))
    summary = train(tiny_config(dropout=0.3, train_steps=1), options, str(run))
    assert summary["steps"] == 1
    assert vocabulary_path(str(run)) != vocabulary_path(str(first_run))
    with open(vocabulary_path(str(run)), "rb") as a, open(vocabulary_path(str(first_run)), "rb") as b:
        assert a.read() == b.read()
    tuned, _ = restore_model(str(run))
    # One step of warmup (a learning rate of ~5e-4) from the source's weights; a fresh start is far away.
    for before, after in zip(source.weights, tuned.weights, strict=True):
        np.testing.assert_allclose(np.array(after), np.array(before), atol=5e-3)
    stored = json.loads((run / "config.json").read_text())["run"]
    assert stored["init_from"] == str(first_run)
    # Rerun: a resume of the new run (the same --init_from), not a second start from the source.
    again = train(tiny_config(dropout=0.3, train_steps=2), options, str(run))
    assert again["steps"] == 2


def test_init_from_refuses_another_architecture_or_vocabulary(first_run, tmp_path, corpus_dir):
    with pytest.raises(ResumeError, match="d_model 32 → 64"):
        train(tiny_config(d_model=64), tiny_options(corpus_dir, init_from=str(first_run)), str(tmp_path / "a"))
    other = tmp_path / "b"
    other.mkdir()
    (other / "sp.model").write_bytes(b"another vocabulary")
    with pytest.raises(ResumeError, match="differs from"):
        train(tiny_config(), tiny_options(corpus_dir, init_from=str(first_run)), str(other))
    with pytest.raises(ResumeError, match="no such run directory or checkpoint"):
        train(tiny_config(), tiny_options(corpus_dir, init_from=str(tmp_path / "nowhere")), str(tmp_path / "c"))

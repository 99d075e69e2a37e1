"""Several corpora mixed by --data_weights in a run: the vocabulary, an exact resume, changed weights refused."""

import dataclasses
import json

import pytest
from absl import app

from pipelines import UNK_ID, Tokenizer
from tests.checkpoints import assert_identical
from tests.corpora import tiny_config, tiny_options
from tf_transformer.cli.train import _weights
from tf_transformer.training.resume import ResumeError
from tf_transformer.training.trainer import train

OTHER_WORDS = "quokka wombat wallaby quoll dingo".split()  # their q and w appear in no word of tests.corpora


def write_other(directory, n=150):
    """A second corpus whose words (and some of their letters) only it has."""
    directory.mkdir(parents=True, exist_ok=True)
    words = [" ".join(OTHER_WORDS[(i + k) % len(OTHER_WORDS)] for k in range(1 + i % 5)) for i in range(n)]
    (directory / "train.en").write_text("\n".join(words) + "\n", encoding="utf-8")
    (directory / "train.de").write_text("\n".join(w.capitalize() + " ." for w in words) + "\n", encoding="utf-8")
    return directory


def test_weights_are_checked_naming_the_flag():
    """The command line reads numbers; the run options, however made, hold one positive weight per source."""
    assert _weights(None) is None and _weights(["0.7", "0.3"]) == (0.7, 0.3)
    with pytest.raises(app.UsageError, match="--data_weights 0.7,x: give numbers"):
        _weights(["0.7", "x"])
    for data, weights, message in [
        (("a", "b", "c"), (0.7, 0.3), "--data_weights gives 2 weight.*for 3 --data source"),
        (("a", "b"), (1.0,), "--data_weights gives 1 weight"),
        ("a", (0.5, 0.5), "--data_weights gives 2 weight.*for 1 --data source"),
        (("a", "b"), (0.7, 0.0), "each weight must be a positive number"),
        (("a", "b"), (-1.0, 2.0), "each weight must be a positive number"),
        (("a", "b"), (1.0, float("inf")), "each weight must be a positive number"),
    ]:
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(tiny_options("a"), data=data, data_weights=weights)
    assert dataclasses.replace(tiny_options("a"), data=("a", "b"), data_weights=(0.7, 0.3)).data_weights == (0.7, 0.3)


@pytest.mark.slow
def test_a_mixed_run_resumes_exactly_and_refuses_other_weights(tmp_path, train_corpus_dir):
    """Two corpora at 0.7/0.3: the vocabulary knows both; a run stopped mid-epoch and resumed ends with every
    tensor of the uninterrupted run's checkpoint; other weights on resume are refused, naming the flag."""
    other = write_other(tmp_path / "other")
    sources = (str(train_corpus_dir), str(other))

    def mixed(data_weights=(0.7, 0.3), **changes):
        options = tiny_options(train_corpus_dir, steps_per_epoch=3, **changes)
        return dataclasses.replace(options, data=sources, data_weights=data_weights)

    reference = tmp_path / "reference"
    train(tiny_config(train_steps=5), mixed(), str(reference))
    run = tmp_path / "run"
    part = train(tiny_config(train_steps=4), mixed(), str(run))
    assert part["steps"] == 4
    resumed = train(tiny_config(train_steps=5), mixed(), str(run))
    assert resumed["steps"] == 5
    assert_identical(run, reference, 5)

    stored = json.loads((run / "config.json").read_text())
    assert stored["run"]["data"] == [str(train_corpus_dir), str(other)]
    assert stored["run"]["data_weights"] == [0.7, 0.3]
    assert sorted(stored["fingerprints"]["corpus"]) == ["1:train.de", "1:train.en", "2:train.de", "2:train.en"]
    pieces = Tokenizer(str(run / "sp.model")).python_processor().encode("quokka wombat")
    assert UNK_ID not in pieces  # the vocabulary was trained on the second corpus too

    with pytest.raises(ResumeError, match=r"--data_weights 0\.7,0\.3 → 0\.5,0\.5"):
        train(tiny_config(train_steps=6), mixed(data_weights=(0.5, 0.5)), str(run))
    with pytest.raises(ResumeError, match="--data "):
        train(tiny_config(train_steps=6), tiny_options(train_corpus_dir), str(run))


def test_each_source_alone_drops_the_mixtures_weights():
    """The options of one source of a weighted mixture (its corpus, its dev split) are valid options alone."""
    from tf_transformer.training.preparation import source_options

    options = dataclasses.replace(tiny_options("a"), data=("a", "b"), data_weights=(0.7, 0.3))
    assert [(each.data, each.data_weights) for each in source_options(options)] == [("a", None), ("b", None)]

"""The best checkpoint by a dev metric and early stopping: the verdicts, the files, export, resume."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests.commands import export_cli
from tests.corpora import tiny_config, tiny_options
from tf_transformer import build_transformer, run_dir
from tf_transformer.tasks import get_task
from tf_transformer.training.best import BestCheckpoint, Metric, best_metric, check_options
from tf_transformer.training.options import OptionError
from tf_transformer.training.resume import training_checkpoint
from tf_transformer.training.trainer import compile_model, train

TRANSLATION, PARSING = get_task("translation"), get_task("parsing")


def test_metric_names_per_task():
    assert best_metric("loss", None, TRANSLATION) == Metric("loss", "val_loss", higher_is_better=False)
    assert best_metric("bleu", None, TRANSLATION) == best_metric("score", None, TRANSLATION)
    assert best_metric("bleu", None, TRANSLATION).key == "val_bleu"
    assert best_metric("f1", None, PARSING) == best_metric("score", None, PARSING) == Metric("f1", "val_f1", True)
    assert best_metric(None, 3, PARSING).name == "loss"  # --early_stopping alone: by loss, as fairseq
    assert best_metric(None, None, PARSING) is None
    with pytest.raises(OptionError, match=r"--keep_best_by bleu: --task parsing scores its dev set by F1.*f1"):
        best_metric("bleu", None, PARSING)
    with pytest.raises(OptionError, match=r"--keep_best_by f1: --task translation .* BLEU.*--keep_best_by bleu"):
        best_metric("f1", None, TRANSLATION)


def test_options_that_make_no_dev_evaluation_are_refused_naming_the_flags(corpus_dir):
    with pytest.raises(OptionError, match="--early_stopping compares .*--dev_split"):
        check_options(tiny_options(corpus_dir, early_stopping=2, dev_split=None), TRANSLATION)
    with pytest.raises(OptionError, match="--keep_best_by bleu needs the dev BLEU.*--dev_bleu_sentences 0"):
        check_options(tiny_options(corpus_dir, keep_best_by="bleu", dev_split="val"), TRANSLATION)
    assert check_options(tiny_options(corpus_dir, keep_best_by="loss", dev_split="val"), TRANSLATION).name == "loss"


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    """A copy of the session's ``tiny_run`` (a run directory with config.json, sp.model and checkpoints)."""
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy, ignore=shutil.ignore_patterns("data_cache", "logs"))
    return copy


def trained_model(run):
    """The run's model with its newest weights, compiled as training compiles it (an optimizer to count steps)."""
    config, _ = run_dir.load_run(str(run))
    model = build_transformer(config)
    compile_model(model, config)
    model.optimizer.build(model.trainable_variables)
    run_dir.load_weights(model, run_dir.default_checkpoint(str(run)), str(run), config)
    return model


def test_the_best_of_several_evaluations_is_kept_and_exported_and_patience_stops(run_copy, tmp_path):
    """val_loss 3.0, 2.0, 2.5, 2.0, 2.6 with patience 3: the second evaluation's weights are the best (an equal
    value is no improvement), training stops at the fifth, ``best.json`` names them and ``tft-export
    --checkpoint best`` exports them, not the newest weights."""
    model = trained_model(run_copy)
    directory = run_dir.best_dir(str(run_copy))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), directory, max_to_keep=1)
    marker = str(run_copy / run_dir.BEST_FILE)
    best = BestCheckpoint(best_metric("loss", 3, TRANSLATION), manager, patience=3, marker=marker)
    best.set_model(model)
    start = model.get_weights()
    for evaluation, loss in enumerate([3.0, 2.0, 2.5, 2.0, 2.6]):
        model.set_weights([w + 0.01 * (evaluation + 1) for w in start])  # each evaluation's own weights
        model.optimizer.iterations.assign(10 * (evaluation + 1))
        assert not model.stop_training
        best.on_epoch_end(evaluation, {"loss": 9.0, "val_loss": loss})
        if evaluation == 1:
            kept = model.get_weights()
    assert model.stop_training and best.exhausted()
    recorded = json.loads((run_copy / run_dir.BEST_FILE).read_text())
    assert recorded == {
        "metric": "loss",
        "value": 2.0,
        "step": 20,
        "epoch": 2,
        "evaluations": 5,
        "evaluations_since_best": 3,
        "checkpoint": "best/ckpt-20",
    }
    assert sorted(p.name for p in (run_copy / "best").glob("*.index")) == ["ckpt-20.index"]  # one kept
    assert best.summary()["evaluations"] == 5 and best.summary()["evaluations_since_best"] == 3
    assert run_dir.resolve_checkpoint(str(run_copy), "best") == str(run_copy / "best" / "ckpt-20")
    restored, _ = run_dir.restore_model(str(run_copy), "best")
    for a, b in zip(restored.get_weights(), kept, strict=True):
        np.testing.assert_array_equal(a, b)

    export = export_cli(run_copy, tmp_path / "export" / "1", "--checkpoint", "best", "--ids_only")
    reader = tf.train.load_checkpoint(str(export / "variables" / "variables"))
    exported = [reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if "_all_variables" in name]
    config, _ = run_dir.load_run(str(run_copy))
    embedding = next(value for value in kept if value.shape == (config.vocab_size, config.d_model))
    newest = embedding + 0.03  # the fifth evaluation's
    assert any(value.shape == embedding.shape and np.array_equal(value, embedding) for value in exported)
    assert not any(value.shape == newest.shape and np.allclose(value, newest) for value in exported)


def test_a_run_without_a_best_checkpoint_says_so(run_copy):
    with pytest.raises(FileNotFoundError, match="no best checkpoint.*--keep_best_by"):
        run_dir.resolve_checkpoint(str(run_copy), "best")


def test_the_verdict_travels_with_the_training_checkpoint(run_copy, tmp_path):
    """What a resumed run compares against (best value, its step, evaluations since) is in the checkpoint."""
    model = trained_model(run_copy)
    metric = best_metric("score", 4, TRANSLATION)

    def tracker(directory):
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory), max_to_keep=1)
        callback = BestCheckpoint(metric, manager, patience=4)
        callback.set_model(model)
        return callback

    first = tracker(tmp_path / "first")
    for epoch, bleu in enumerate([1.0, 4.0, 3.0]):
        first.on_epoch_end(epoch, {"val_bleu": bleu})
    path = training_checkpoint(model, best=first.state).write(str(tmp_path / "ckpt"))
    second = tracker(tmp_path / "second")
    training_checkpoint(model, best=second.state).read(path).assert_existing_objects_matched()
    second.restored()
    assert (
        second.summary()
        == first.summary()
        == {
            "metric": "bleu",
            "value": 4.0,
            "step": 4,  # the step of the run the weights come from
            "epoch": 2,
            "evaluations": 3,
            "evaluations_since_best": 1,
        }
    )
    third = tracker(tmp_path / "third")  # a state of another metric starts afresh
    third.metric = best_metric("loss", None, TRANSLATION)
    training_checkpoint(model, best=third.state).read(path).assert_existing_objects_matched()
    third.restored()
    assert third.summary() is None and float(third.state.value.numpy()) == np.inf


@pytest.mark.slow
def test_early_stopping_stops_a_resumed_run_where_one_run_stops(tmp_path, train_corpus_dir):
    """Weights that do not move (a learning rate of 0) give the same validation loss every epoch: the first
    evaluation is the best, and with patience 2 one run stops at the third (step 6 of 12, 2 per epoch). A run
    stopped after two evaluations and resumed keeps the best and the count since it, and stops there too; a
    run that stopped early, rerun, trains no further."""
    options = tiny_options(
        train_corpus_dir, dev_split="val", steps_per_epoch=2, checkpoint_every=0, keep_best_by="loss", early_stopping=2
    )
    run = str(tmp_path / "run")
    part = train(tiny_config(learning_rate_scale=0.0, train_steps=4), options, run)
    assert part["steps"] == 4 and part["stopped_by"] is None
    assert part["best"]["evaluations"] == 2 and part["best"]["evaluations_since_best"] == 1
    config = tiny_config(learning_rate_scale=0.0, train_steps=12)
    resumed = train(config, options, run)
    assert resumed["stopped_by"] == "early_stopping" and resumed["steps"] == 6
    best = resumed["best"]
    assert (best["step"], best["epoch"], best["evaluations"], best["evaluations_since_best"]) == (2, 1, 3, 2)
    assert best["value"] == part["best"]["value"] == pytest.approx(resumed["history"]["val_loss"][-1], abs=0)
    recorded = json.loads((tmp_path / "run" / "best.json").read_text())
    assert recorded == {**best, "checkpoint": "best/ckpt-2"}  # the patience count too
    again = train(config, options, run)
    assert again["steps"] == 6 and again["stopped_by"] == "early_stopping" and again["history"] == {}

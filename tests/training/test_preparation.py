"""Preparing a run, step by step: directory and options, vocabulary and data, model and optimizer, restore,
callbacks. Each step alone, on the tiny preset and a synthetic corpus, in one process (no training)."""

import dataclasses
import json

import keras
import pytest
import tensorflow as tf

from tests.corpora import tiny_config, tiny_options
from tf_transformer import run_dir
from tf_transformer.training import preparation
from tf_transformer.training.callbacks import DataPosition, StepCheckpoint, StopAtStep
from tf_transformer.training.options import resolve
from tf_transformer.training.progress import ProgressLogger
from tf_transformer.training.resume import ResumeError

STRATEGY = tf.distribute.get_strategy()  # the default: one process, one device


def place_of(model_dir, corpus_dir, **changes):
    options = tiny_options(corpus_dir, **changes)
    return preparation.directory_and_options(tiny_config(), resolve(options, STRATEGY), str(model_dir), STRATEGY)


def test_directory_and_options_make_the_directory_and_refuse_another_model(tmp_path, corpus_dir):
    place = place_of(tmp_path / "run", corpus_dir)
    assert (tmp_path / "run").is_dir() and place.work_dir == place.model_dir and place.chief
    assert not place.resuming and place.source_dir is None and place.metric is None and place.launch_token is None
    assert place.record(tiny_config(), 2)["num_replicas"] == 2 and place.record(tiny_config(), 2)["vocab_size"] == 120
    run_dir.save_run(str(tmp_path / "run"), tiny_config(d_model=48), place.record(tiny_config(), 1), [])
    with pytest.raises(ResumeError, match="different model config.*d_model"):
        place_of(tmp_path / "run", corpus_dir)
    with_best = place_of(tmp_path / "other", corpus_dir, keep_best_by="loss", dev_split="train")
    assert with_best.metric is not None and with_best.metric.name == "loss"


def test_vocabulary_and_data_write_the_run_and_count_its_updates(tmp_path, corpus_dir):
    place = place_of(tmp_path / "run", corpus_dir, epochs=2, accumulate_steps=3)
    inputs = preparation.vocabulary_and_data(tiny_config(vocab_size=1000), place, replicas=1)  # more than it has
    size = inputs.tokenizer.vocab_size
    assert inputs.config.vocab_size == size < 1000
    # --epochs sets the length, not the config's train_steps (4).
    assert inputs.steps_per_epoch == 4 and inputs.total_micro == 8 and inputs.train_steps == 3  # ceil(8 / 3)
    assert inputs.validation is None and inputs.dev_sources == []
    stored = json.loads((tmp_path / "run" / run_dir.CONFIG_FILE).read_text())
    assert stored["model"]["vocab_size"] == size and stored["run"]["vocab_size"] == 1000  # made, and asked
    assert stored["run"]["epochs"] == 2 and stored["model"]["tokens_per_batch"] == 512
    assert (tmp_path / "run" / "sp.model").exists()


def test_model_and_optimizer_are_built_for_a_checkpoint_to_restore_into():
    config = tiny_config()
    model = preparation.model_and_optimizer(config, tiny_options("unused", accumulate_steps=2), STRATEGY)
    assert model.built and model.optimizer.built and model.optimizer.variables
    assert model.optimizer.iterations.numpy() == 0


def test_restore_resumes_the_newest_checkpoint_with_its_data_position(tmp_path, corpus_dir):
    place = place_of(tmp_path / "run", corpus_dir)
    inputs = preparation.vocabulary_and_data(tiny_config(), place, replicas=1)
    model = preparation.model_and_optimizer(inputs.config, place.options, STRATEGY)
    state = preparation.restore(model, place)
    assert state.manager is state.chief_manager and state.best is None
    assert int(state.position.batches.numpy()) == 0 and state.chief_manager.latest_checkpoint is None
    state.position.batches.assign(7)
    weight = model.trainable_variables[0]
    weight.assign(weight + 1.0)
    expected = weight.numpy()
    state.manager.save()
    fresh = preparation.model_and_optimizer(inputs.config, place.options, STRATEGY)
    resumed = preparation.restore(fresh, place_of(tmp_path / "run", corpus_dir))
    assert int(resumed.position.batches.numpy()) == 7
    assert (fresh.trainable_variables[0].numpy() == expected).all()


@pytest.mark.parametrize("verbose", [0, 2])
def test_callbacks_come_in_the_order_their_work_needs(tmp_path, corpus_dir, verbose):
    place = place_of(tmp_path / "run", corpus_dir, verbose=verbose)
    inputs = preparation.vocabulary_and_data(tiny_config(), place, replicas=1)
    model = preparation.model_and_optimizer(inputs.config, place.options, STRATEGY)
    state = preparation.restore(model, place)
    callbacks = preparation.run_callbacks(place, inputs, model, state)
    kinds = [type(callback) for callback in callbacks.all]
    assert isinstance(callbacks.all[0], DataPosition)  # first: a checkpoint at a batch's end counts that batch
    assert kinds.index(StepCheckpoint) > kinds.index(type(callbacks.dev_evaluation))  # after the evaluation
    assert StopAtStep in kinds and callbacks.checkpointer in callbacks.all and callbacks.stop_requests in callbacks.all
    assert isinstance(callbacks.all[-1], keras.callbacks.TensorBoard)
    assert (ProgressLogger in kinds) == bool(verbose)
    prepared = preparation.PreparedRun(place, inputs, STRATEGY, model, state, callbacks)
    assert prepared.done_micro == 0 and not prepared.finished() and prepared.accumulate == 1
    by_epochs = dataclasses.replace(place, options=dataclasses.replace(place.options, epochs=1))
    assert dataclasses.replace(prepared, place=by_epochs).by_epochs and not prepared.by_epochs

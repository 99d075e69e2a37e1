"""The run directory: which checkpoint commands load, and strict restores."""

import json
import logging
import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from tests.commands import BIN
from tf_transformer.run_dir import checkpoint_dir, default_checkpoint, restore_model
from tf_transformer.training.averaging import average_checkpoints


@pytest.fixture
def run(tiny_run, tmp_path):
    """A copy of ``tiny_run`` with a second, later checkpoint (ckpt-8: ckpt-4's weights, scaled)."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("data_cache", "logs"))
    model, _ = restore_model(str(run), str(run / "checkpoints" / "ckpt-4"))
    for weight in model.weights:
        weight.assign(weight * 1.5)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), checkpoint_dir(str(run)), max_to_keep=5)
    manager.save(checkpoint_number=8)
    return run


def test_an_average_is_loaded_only_while_it_holds_the_newest_checkpoint(run, caplog):
    averaged = average_checkpoints(str(run), last=2)
    assert default_checkpoint(str(run)) == averaged
    mean, _ = restore_model(str(run))  # an average holds the model's weights only: it loads all the same
    halfway = np.array(restore_model(str(run), str(run / "checkpoints" / "ckpt-4"))[0].weights[0]) * 1.25
    np.testing.assert_allclose(np.array(mean.weights[0]), halfway, rtol=1e-6)
    model, _ = restore_model(str(run), str(run / "checkpoints" / "ckpt-8"))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), checkpoint_dir(str(run)), max_to_keep=5)
    newest = manager.save(checkpoint_number=12)  # training went on after averaging
    with caplog.at_level(logging.WARNING):
        assert default_checkpoint(str(run)) == newest
    assert "ckpt-12 is newer" in caplog.text and "tft-average" in caplog.text
    loaded, _ = restore_model(str(run))
    np.testing.assert_array_equal(np.array(loaded.weights[0]), np.array(model.weights[0]))


def test_a_checkpoint_of_another_model_is_refused(run):
    config_path = run / "config.json"
    stored = json.loads(config_path.read_text())
    stored["model"]["num_layers"] = 3  # a layer the checkpoint has no weights for
    config_path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="does not match the model of .*config.json"):
        restore_model(str(run))
    stored["model"]["num_layers"], stored["model"]["d_ff"] = 2, 128  # weights of another shape
    config_path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="does not match"):
        restore_model(str(run))


@pytest.mark.slow
def test_commands_say_which_checkpoint_they_load(run, tmp_path):
    exported = subprocess.run(
        [
            str(BIN / "tft-export"),
            "--model_dir",
            str(run),
            "--output",
            str(tmp_path / "export" / "1"),
            "--norequest_signatures",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads(exported.stdout.strip().splitlines()[-1])["checkpoint"].endswith("ckpt-8")
    translated = subprocess.run(
        [str(BIN / "tft-translate"), "--model_dir", str(run)],
        input="zeta\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert f"checkpoint: {os.path.join(str(run), 'checkpoints', 'ckpt-8')}" in translated.stderr


def test_a_run_directory_through_tf_io_gfile(corpus_dir, tmp_path, monkeypatch):
    """``model_dir`` may be a path of TensorFlow's filesystems (``gs://…``); ``ram://`` stands in for one."""
    import pipelines
    from configs import get_config
    from tf_transformer.files import save_json
    from tf_transformer.run_dir import data_cache_dir, load_run, make_vocabulary, save_run, vocabulary_path
    from tf_transformer.training.preparation import check_model_dir
    from tf_transformer.training.resume import source_run, take_vocabulary

    model_dir = f"ram://{tmp_path.name}/run"  # the RAM filesystem is one per process
    config = get_config("tiny")
    check_model_dir(model_dir, config)
    assert tf.io.gfile.isdir(model_dir)
    corpus = pipelines.find_split(str(corpus_dir), "train", "en", "de")
    tokenizer = make_vocabulary(model_dir, corpus, size=60)
    assert tf.io.gfile.listdir(model_dir) == ["sp.model"]  # trained locally, copied whole
    assert make_vocabulary(model_dir, corpus, size=60).model_proto == tokenizer.model_proto  # found, not retrained
    save_run(model_dir, config.replace(vocab_size=tokenizer.vocab_size), {"seed": 3})
    save_json(f"{model_dir}/train_summary.json", {"steps": 4})
    stored, run = load_run(model_dir)
    assert stored.vocab_size == tokenizer.vocab_size and run == {"seed": 3}
    check_model_dir(model_dir, config)  # the same model config: accepted
    check_model_dir(model_dir, config.replace(train_steps=9))  # a run setting: compared as a run option
    with pytest.raises(ValueError, match="different model config"):
        check_model_dir(model_dir, config.replace(d_ff=128))

    tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), checkpoint_dir(model_dir), 1).save()
    assert source_run(f"{model_dir}/checkpoints/ckpt-1") == (model_dir, f"{model_dir}/checkpoints/ckpt-1")
    fine_tuned = f"ram://{tmp_path.name}/fine_tuned"
    take_vocabulary(fine_tuned, model_dir)
    assert tf.io.gfile.GFile(vocabulary_path(fine_tuned), "rb").read() == tokenizer.model_proto

    # The tokenized-data cache is written with local file calls: it stays on this machine.
    monkeypatch.setenv("TFT_DATA_CACHE", str(tmp_path / "cache"))
    assert data_cache_dir(model_dir) == str(tmp_path / "cache")
    assert data_cache_dir(str(tmp_path / "run")) == str(tmp_path / "run" / "data_cache")


@pytest.mark.slow
def test_training_writes_and_resumes_a_run_through_tf_io_gfile(corpus_dir, tmp_path, monkeypatch):
    from tests.corpora import tiny_config, tiny_options
    from tf_transformer.training.trainer import train

    monkeypatch.setenv("TFT_DATA_CACHE", str(tmp_path / "cache"))
    model_dir = f"ram://{tmp_path.name}/run"
    train(tiny_config(train_steps=2), tiny_options(corpus_dir, checkpoint_every=1), model_dir)
    summary = train(tiny_config(), tiny_options(corpus_dir, checkpoint_every=1), model_dir)
    assert summary["steps"] == 4 and summary["latest_checkpoint"] == f"{model_dir}/checkpoints/ckpt-4"
    names = set(tf.io.gfile.listdir(model_dir))
    assert {"config.json", "sp.model", "train_summary.json", "checkpoints/", "logs/"} <= names | {
        name + "/" for name in names
    }, names
    assert list((tmp_path / "cache").iterdir())  # the data cache on this machine's disk
    restore_model(model_dir)


def test_a_checkpoint_is_flushed_before_the_state_file_lists_it(tmp_path, monkeypatch):
    """TensorFlow renames the ``checkpoint`` state file into place unflushed, and may list a checkpoint whose
    data the disk has not written yet: a power cut then leaves a newest checkpoint that cannot be read."""
    from tf_transformer.run_dir import save_checkpoint

    directory = tmp_path / "checkpoints"
    state = directory / "checkpoint"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(directory), max_to_keep=2)
    save_checkpoint(manager, 1)
    calls = []
    real = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        content = pathlib.Path(path).read_bytes() if os.path.isfile(path) else None
        calls.append((path, content, state.read_bytes()))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    save_checkpoint(manager, 2)
    final = state.read_bytes()
    assert b"ckpt-2" in final
    for name in ("ckpt-2.index", "ckpt-2.data-00000-of-00001"):
        flushed = [listed for path, _, listed in calls if path == str(directory / name)]
        assert flushed and b"ckpt-2" not in flushed[0], f"{name} was not flushed before it was listed: {calls}"
    staged = [path for path, content, listed in calls if content == final and path != str(state) and listed != final]
    assert staged, f"the state file was not flushed before it was renamed into place: {calls}"
    assert [listed for path, _, listed in calls if path == str(directory) and listed == final], calls
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        ["checkpoint", *(f"ckpt-{n}.{part}" for n in (1, 2) for part in ("index", "data-00000-of-00001"))]
    )


def test_checkpoints_of_a_relative_run_directory_are_listed_where_they_are(tmp_path, monkeypatch):
    """``make demo`` trains in ``runs/…``, a relative path: the state file listed ``../../../ckpt-N`` (TensorFlow
    took the names for paths relative to the working directory), and averaging found no checkpoint."""
    from tf_transformer.run_dir import checkpoints, save_checkpoint

    monkeypatch.chdir(tmp_path)
    directory = os.path.join("runs", "demo", "checkpoints")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), directory, max_to_keep=3)
    for step in (1, 2):
        save_checkpoint(manager, step)
    listed = checkpoints(directory)
    assert listed == [os.path.join(directory, "ckpt-1"), os.path.join(directory, "ckpt-2")]
    assert all(os.path.exists(path + ".index") for path in listed)
    assert tf.train.latest_checkpoint(directory) == os.path.join(directory, "ckpt-2")
    restarted = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(0.0)), directory, max_to_keep=3)
    assert restarted.checkpoints == listed  # a resumed run keeps counting them


def test_a_state_file_listing_checkpoints_elsewhere_finds_them_beside_it(tmp_path, monkeypatch):
    """TensorFlow's own writer lists ``../../../ckpt-N`` for a relative directory: the checkpoints are found."""
    from tf_transformer.run_dir import checkpoints, save_checkpoint

    monkeypatch.chdir(tmp_path)
    directory = os.path.join("runs", "demo", "checkpoints")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), directory, max_to_keep=3)
    for step in (1, 2):
        save_checkpoint(manager, step)
    state = pathlib.Path(directory, "checkpoint")
    state.write_text(state.read_text().replace('"ckpt-', '"../../../ckpt-'))
    expected = [os.path.join(directory, "ckpt-1"), os.path.join(directory, "ckpt-2")]
    assert checkpoints(directory) == expected
    assert "../" in state.read_text()  # a reader leaves the file alone
    # The writer repairs it before its CheckpointManager reads it: the manager then restores, keeps counting
    # and deletes the old checkpoints (a manager reading ../../../ckpt-N found none of them).
    assert checkpoints(directory, repair=True) == expected and "../" not in state.read_text()
    resumed = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(0.0)), directory, max_to_keep=2)
    assert resumed.checkpoints == expected
    resumed.checkpoint.restore(resumed.latest_checkpoint).assert_consumed()
    save_checkpoint(resumed, 3)
    assert checkpoints(directory) == expected[1:] + [os.path.join(directory, "ckpt-3")]
    assert not os.path.exists(expected[0] + ".index")


def test_a_run_directory_records_its_format_and_another_format_is_refused_naming_both(tmp_path):
    from configs import get_config
    from tf_transformer.formats import FormatError
    from tf_transformer.run_dir import RUN_FORMAT, load_run, save_run, stored_fingerprints

    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    save_run(str(run), get_config("tiny"), {"seed": 3})
    assert load_run(str(run)) == (get_config("tiny"), {"seed": 3})
    stored = json.loads((run / "config.json").read_text())
    assert stored["format"] == RUN_FORMAT == 2
    # Format 1 kept the run settings in the run options: refused, not read otherwise.
    for recorded, named in ((1, "format 1"), (RUN_FORMAT + 1, "format 3"), (None, "format none")):
        changed = {key: value for key, value in stored.items() if key != "format"}
        if recorded is not None:
            changed["format"] = recorded
        (run / "config.json").write_text(json.dumps(changed))
        expected = re.escape(f"{run / 'config.json'}: run directory {named}") + ".*, this tf_transformer reads format 2"
        for read in (load_run, stored_fingerprints):
            with pytest.raises(FormatError, match=expected):
                read(str(run))

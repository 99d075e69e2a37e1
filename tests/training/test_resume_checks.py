"""What a resume checks before it writes anything: the precision's checkpoint graph, the corpus's bytes,
the vocabulary's bytes, ``jit_compile``, the number of replicas; and a ``checkpoint`` state file that is
garbled or cannot be read."""

import json
import logging
import os
import shutil
import subprocess

import pytest
import tensorflow as tf

import pipelines
from configs import get_config
from tests.commands import BIN
from tests.corpora import tiny_config, tiny_options, write_corpus
from tf_transformer.files import ReadError
from tf_transformer.training.resume import ResumeError
from tf_transformer.training.trainer import train

pytestmark = pytest.mark.slow  # each test trains or resumes a run

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("resume_checks_corpus")
    write_corpus(directory, n=200)
    return directory


def _options(corpus, **changes):
    return tiny_options(corpus, **{"checkpoint_every": 1, **changes})


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """A run of 2 steps (checkpoints 1 and 2) in each precision."""
    root = tmp_path_factory.mktemp("resume_checks")
    for precision in PRECISIONS:
        train(tiny_config(train_steps=2), _options(corpus, precision=precision), str(root / precision))
    return root


def test_a_run_leaves_the_callers_precision_so_what_is_built_next_computes_in_float32(corpus, tmp_path):
    """make demo and benchmarks.quality export in the process that trained: the export recorded the run's
    mixed precision (float32 weights cast every step) where tft-export in a new process writes float32."""
    import keras

    from tf_transformer.exporting.saved_model import export_run

    keras.config.set_dtype_policy("float32")
    run = tmp_path / "run"
    train(tiny_config(train_steps=1), _options(corpus, precision="mixed_bfloat16"), str(run))
    assert keras.config.dtype_policy().name == "float32"
    export = tmp_path / "export" / "1"
    export_run(str(run), str(export), alignment_layer=None, request_signatures=False)
    assert json.loads((export / "assets.extra" / "tf_transformer.json").read_text())["dtype"] == "float32"


@pytest.fixture
def copy_run(runs, tmp_path):
    def copy(precision="float32"):
        run = tmp_path / f"run_{precision}"
        shutil.copytree(runs / precision, run)
        return run

    return copy


def _snapshot(run):
    """config.json and the checkpoints' files, with their inodes: a rewrite shows even with the same bytes."""
    paths = [run / "config.json", *sorted((run / "checkpoints").iterdir())]
    return {p.name: (p.read_bytes(), os.stat(p).st_ino) for p in paths if p.is_file()}


def _changes_graph(old, new):
    return (old == "mixed_float16") != (new == "mixed_float16")


@pytest.mark.parametrize("old", PRECISIONS)
@pytest.mark.parametrize("new", PRECISIONS)
def test_precision_on_resume(copy_run, corpus, old, new):
    """Moving to or from mixed_float16 (its optimizer is a LossScaleOptimizer: another checkpoint graph) is
    refused before anything is written, naming both; float32 and mixed_bfloat16 carry the whole state across."""
    run = copy_run(old)
    before = _snapshot(run)
    options = _options(corpus, precision=new)
    if _changes_graph(old, new):
        with pytest.raises(ResumeError) as error:
            train(tiny_config(train_steps=3), options, str(run))
        assert f"--precision {old} → {new}" in str(error.value)
        assert _snapshot(run) == before  # config.json and the checkpoint state untouched
        return
    _assert_restores_whole(run / "checkpoints" / "ckpt-2", new)
    summary = train(tiny_config(train_steps=3), options, str(run))
    assert summary["steps"] == 3 and summary["precision"] == new


def _assert_restores_whole(path, precision):
    """Every value of the checkpoint at ``path`` lands in a training model built under ``precision``."""
    import keras

    from tf_transformer.model import build_transformer
    from tf_transformer.run_dir import load_run
    from tf_transformer.training.recipe import compile_model
    from tf_transformer.training.resume import training_checkpoint

    config, _ = load_run(str(path.parent.parent))
    keras.config.set_dtype_policy(precision)
    try:
        model = build_transformer(config)
        compile_model(model, config, 1, False)
        model.optimizer.build(model.trainable_variables)
        checkpoint = training_checkpoint(model, data_position=tf.Variable(0, dtype=tf.int64))
        checkpoint.restore(str(path)).assert_consumed()
        assert int(model.optimizer.iterations.numpy()) == 2
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("stored", ["mixed_float16", "mixed_bfloat16"])
def test_precision_auto_keeps_the_runs_own_on_resume(copy_run, corpus, stored):
    """``--precision auto`` resolves per machine; on resume it keeps the precision the run trained in
    where that still works here. Where the machine would choose the same (``mixed_bfloat16`` on a CPU with a
    bfloat16 unit), the reason is the machine's; elsewhere it says the run's precision was kept."""
    from tf_transformer.training.options import choose_precision

    run = copy_run(stored)
    summary = train(tiny_config(train_steps=3), _options(corpus, precision="auto"), str(run))
    assert summary["steps"] == 3 and summary["precision"] == stored
    recorded = json.loads((run / "config.json").read_text())["run"]
    assert recorded["precision"] == stored
    machine, reason = choose_precision()
    if machine == stored:
        assert recorded["precision_reason"] == reason
    else:
        assert "kept" in recorded["precision_reason"]


def test_a_corpus_whose_bytes_changed_is_refused(copy_run, corpus, tmp_path):
    """The same path, size and modification time, other bytes: another data stream."""
    own = tmp_path / "corpus"
    shutil.copytree(corpus, own)
    run = tmp_path / "run"
    train(tiny_config(train_steps=2), _options(own), str(run))
    before = _snapshot(run)
    target = own / "train.de"
    stat = os.stat(target)
    text = target.read_text()
    target.write_text(text.replace("alpha", "omega", 1) if "alpha" in text else text.replace("beta", "gamma", 1))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(target).st_size == stat.st_size
    with pytest.raises(ResumeError) as error:
        train(tiny_config(train_steps=3), _options(own), str(run))
    assert "--data" in str(error.value) and "train.de" in str(error.value)
    assert _snapshot(run) == before


def test_another_vocabulary_of_the_same_size_is_refused(copy_run, corpus, tmp_path):
    run = copy_run()
    other = tmp_path / "other_corpus"
    write_corpus(other, n=200, seed=7)
    pipelines.train_sentencepiece(
        pipelines.find_split(str(other), "train", "en", "de").pairs(), str(tmp_path / "other.model"), vocab_size=120
    )
    assert (tmp_path / "other.model").read_bytes() != (run / "sp.model").read_bytes()
    shutil.copyfile(tmp_path / "other.model", run / "sp.model")
    before = _snapshot(run)
    with pytest.raises(ResumeError) as error:
        train(tiny_config(train_steps=3), _options(corpus), str(run))
    assert "sp.model" in str(error.value) and "--model_dir" in str(error.value)
    assert _snapshot(run) == before


def test_jit_compile_changed_on_resume_is_refused(copy_run, corpus):
    run = copy_run()
    before = _snapshot(run)
    with pytest.raises(ResumeError, match="--jit_compile False → True"):
        train(tiny_config(train_steps=3), _options(corpus, jit_compile=True), str(run))
    assert _snapshot(run) == before


def test_another_number_of_replicas_is_refused_naming_flags_that_exist(copy_run, corpus):
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs the two logical CPU devices of tests/conftest.py")
    run = copy_run()
    with pytest.raises(ResumeError) as error:
        train(tiny_config(train_steps=3), _options(corpus, strategy="mirrored"), str(run))
    message = str(error.value)
    assert "replicas 1 → 2" in message and "--strategy" in message
    assert "--num_replicas" not in message


def test_tft_train_refuses_a_changed_precision_as_a_usage_error(tmp_path, corpus):
    """A refused resume is a usage error (exit status 1, the message), not a traceback after config.json
    was rewritten."""
    run = tmp_path / "run"
    command = [str(BIN / "tft-train"), "--config=tiny", f"--data={corpus}", "--dev_split=", f"--model_dir={run}"]
    command += ["--tokens_per_batch=512", "--max_train_length=64", "--vocab_size=120", "--dev_bleu_sentences=0"]
    first = subprocess.run([*command, "--train_steps=1", "--precision=float32"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    before = (run / "config.json").read_bytes()
    again = subprocess.run([*command, "--train_steps=2", "--precision=mixed_float16"], capture_output=True, text=True)
    assert again.returncode == 1, again.stderr[-3000:]
    assert "--precision float32 → mixed_float16" in again.stderr
    assert "Traceback" not in again.stderr, again.stderr[-3000:]
    assert (run / "config.json").read_bytes() == before


def test_tft_train_refuses_another_model_config_as_a_usage_error(tmp_path, corpus):
    """A --model_dir holding a run of another model config: exit status 1 naming the fields, no traceback."""
    from tf_transformer import run_dir

    run = tmp_path / "run"
    run.mkdir()
    run_dir.save_run(str(run), get_config("small"), {})
    before = (run / "config.json").read_bytes()
    command = [str(BIN / "tft-train"), "--config=tiny", f"--data={corpus}", "--dev_split=", f"--model_dir={run}"]
    refused = subprocess.run([*command, "--train_steps=1", "--vocab_size=120"], capture_output=True, text=True)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "different model config" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (run / "config.json").read_bytes() == before


@pytest.mark.parametrize(
    "garbled",
    [b'model_checkpoint_path: "ckpt-2"\nall_model_che', b'model_checkpoint_path: "ckpt-2"\n\xff\x00', b""],
    ids=["cut_short", "not_text", "empty"],
)
def test_a_garbled_checkpoint_state_resumes_from_the_checkpoint_files(copy_run, corpus, caplog, garbled):
    """TensorFlow takes a garbled ``checkpoint`` file for "no checkpoint" (the run would start again at
    step 0 and write over ckpt-1 and ckpt-2) or fails on it. The checkpoints on disk are used instead."""
    run = copy_run()
    checkpoints = run / "checkpoints"
    (checkpoints / "checkpoint").write_bytes(garbled)
    before = {name: value for name, value in _snapshot(run).items() if name.startswith("ckpt-")}
    # The absl logger's own level: an earlier test (tft-demo) may have set absl's verbosity to WARNING.
    with caplog.at_level(logging.INFO, logger="absl"):
        summary = train(tiny_config(train_steps=3), _options(corpus), str(run))
    assert summary["steps"] == 3
    assert "Resumed from" in caplog.text and "ckpt-2" in caplog.text
    after = _snapshot(run)
    assert {name: after[name] for name in before} == before  # not written over
    state = tf.train.get_checkpoint_state(str(checkpoints))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-1", "ckpt-2", "ckpt-3"]


def test_a_checkpoint_state_that_cannot_be_read_stops_the_run(copy_run, corpus, monkeypatch):
    """A read error (permissions, storage briefly unavailable) is not "no checkpoint": it propagates."""
    from tensorflow.python.lib.io import file_io

    run = copy_run()
    state = str(run / "checkpoints" / "checkpoint")
    real = file_io.FileIO.read

    def read(self, n=-1):
        if self.name == state:
            raise tf.errors.PermissionDeniedError(None, None, f"{state}; Permission denied")
        return real(self, n)

    monkeypatch.setattr(file_io.FileIO, "read", read)
    before = _snapshot(run)
    with pytest.raises((ReadError, tf.errors.PermissionDeniedError), match="Permission denied"):
        train(tiny_config(train_steps=3), _options(corpus), str(run))
    assert _snapshot(run) == before

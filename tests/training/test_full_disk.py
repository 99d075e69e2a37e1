"""A full disk (simulated with RLIMIT_FSIZE: a write past the limit fails with EFBIG, as on a full disk)
while checkpointing, averaging or exporting: a clear error, nothing half-written, the previous state usable."""

import contextlib
import os
import resource
import signal

import pytest
import tensorflow as tf

from tests.corpora import tiny_config, tiny_options
from tf_transformer.exporting.saved_model import export_run
from tf_transformer.files import WriteError
from tf_transformer.run_dir import restore_model
from tf_transformer.training.averaging import average_checkpoints
from tf_transformer.training.trainer import train

LIMIT = 48 * 1024  # below a tiny model's checkpoint (~450 KB), above config.json


@contextlib.contextmanager
def full_disk():
    """Files written in the block cannot grow past ``LIMIT`` bytes."""
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN  # Python's default: EFBIG, not death
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _listing(directory):
    return sorted(os.listdir(directory))


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus_dir):
    run = tmp_path_factory.mktemp("full_disk") / "run"
    train(tiny_config(train_steps=2), tiny_options(corpus_dir, checkpoint_every=1), str(run))
    return run


@pytest.mark.slow
def test_checkpoint_on_a_full_disk_fails_clearly_and_keeps_the_previous_one(run, corpus_dir):
    options = tiny_options(corpus_dir, checkpoint_every=1)
    with full_disk(), pytest.raises(WriteError) as error:
        train(tiny_config(), options, str(run))
    assert "ckpt-3" in str(error.value) and "ckpt-2, is intact" in str(error.value)
    checkpoints = run / "checkpoints"
    assert not [name for name in _listing(checkpoints) if name.startswith("ckpt-3")], _listing(checkpoints)
    assert tf.train.latest_checkpoint(str(checkpoints)).endswith("ckpt-2")
    restore_model(str(run))  # whole and readable
    assert train(tiny_config(), options, str(run))["steps"] == 4  # space again: resumes


@pytest.mark.slow
def test_average_on_a_full_disk_keeps_the_previous_average(run):
    average_checkpoints(str(run), last=2)
    averaged = run / "averaged"
    before = {name: (averaged / name).read_bytes() for name in _listing(averaged)}
    with full_disk(), pytest.raises(WriteError, match="average already at .* is unchanged"):
        average_checkpoints(str(run), last=1)
    assert {name: (averaged / name).read_bytes() for name in _listing(averaged)} == before
    assert not [name for name in _listing(run) if "partial" in name], _listing(run)


@pytest.mark.slow
def test_export_on_a_full_disk_leaves_nothing(run, tmp_path):
    output = tmp_path / "saved_models" / "m" / "1"
    with full_disk(), pytest.raises(WriteError, match="Nothing was written"):
        export_run(str(run), str(output), request_signatures=False)
    assert _listing(output.parent) == []

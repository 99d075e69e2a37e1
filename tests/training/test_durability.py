"""A disk that is really full: a small tmpfs mounted in a user and mount namespace of its own
(``unshare -rm``), where every write fails with ENOSPC as on a full disk, not only writes past a
per-file size limit (tests/training/test_full_disk.py). Checkpoints, config.json, averages and exports
fail with a clear error, leave nothing half-written, keep what was there, and the run resumes once
there is room again."""

import copy
import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZE = "24m"  # the tmpfs: a tiny run, its checkpoints, an average and an export fit


def _mount_command(mount) -> list[str]:
    return ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={SIZE} tmpfs "{mount}" && exec "$@"', "sh"]


def _can_mount(tmp_path) -> str | None:
    """Why a tmpfs cannot be mounted here (``None`` if it can)."""
    if not shutil.which("unshare"):
        return "no unshare command (util-linux)"
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        done = subprocess.run([*_mount_command(probe), "true"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unshare failed: {error}"
    if done.returncode != 0:
        return f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()[:300]}"
    return None


@pytest.mark.slow
def test_a_really_full_disk(tmp_path, corpus_dir):
    why = _can_mount(tmp_path)
    if why:
        pytest.skip(why)
    mount = tmp_path / "disk"
    mount.mkdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(ROOT)}
    script = f"from tests.training.test_durability import on_a_full_disk; on_a_full_disk{(str(mount), str(corpus_dir))}"
    done = subprocess.run(
        [*_mount_command(mount), sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    assert "full disk: all checked" in done.stdout


class Filler:
    """Fills the disk under ``directory`` until a write fails with ENOSPC, then leaves ``room`` bytes free."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "filler")

    def fill(self, room: int = 0) -> None:
        """Leaves ``room`` bytes free (rounded to the tmpfs's pages)."""
        with open(self.path, "ab") as handle:
            chunk = b"\0" * (1 << 16)
            try:
                while True:
                    handle.write(chunk)
                    handle.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
            size = handle.tell()
        os.truncate(self.path, max(0, size - room))

    def free(self) -> None:
        os.remove(self.path)


def _leftovers(root) -> list[str]:
    return [
        os.path.join(directory, name)
        for directory, dirs, files in os.walk(root)
        for name in dirs + files
        if "partial" in name or name.endswith("_temp") or ".tmp" in name
    ]


def _files(directory) -> dict:
    return {name: pathlib.Path(directory, name).read_bytes() for name in sorted(os.listdir(directory))}


def on_a_full_disk(mount: str, corpus: str) -> None:
    """Runs inside the mount namespace, ``mount`` being the tmpfs."""
    import tensorflow as tf

    from tests.corpora import tiny_config, tiny_options
    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.files import WriteError, save_json
    from tf_transformer.run_dir import restore_model
    from tf_transformer.training.averaging import average_checkpoints
    from tf_transformer.training.trainer import train

    run = os.path.join(mount, "run")
    checkpoints = os.path.join(run, "checkpoints")
    options = tiny_options(corpus, checkpoint_every=1)
    train(tiny_config(train_steps=2), options, run)
    averaged = average_checkpoints(run, last=2)
    average_before = _files(os.path.dirname(averaged))
    filler = Filler(mount)

    # A checkpoint that does not fit (config.json, a few KB, still does): the previous one stays the newest.
    filler.fill(room=64 * 1024)
    try:
        train(tiny_config(), options, run)
        raise AssertionError("training on a full disk did not fail")
    except WriteError as error:
        assert "ckpt-3" in str(error) and "ckpt-2, is intact" in str(error), error
    assert not [name for name in os.listdir(checkpoints) if name.startswith("ckpt-3")], os.listdir(checkpoints)
    assert tf.train.latest_checkpoint(checkpoints).endswith("ckpt-2")
    restore_model(run)
    assert not _leftovers(mount), _leftovers(mount)
    filler.free()

    # The disk fills between a checkpoint's files and the list that names them (TensorFlow's state file).
    real_save = tf.train.CheckpointManager.save

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        options = copy.copy(options) if options else tf.train.CheckpointOptions()
        options.experimental_write_callbacks = [*(options.experimental_write_callbacks or []), lambda: filler.fill()]
        return real_save(self, checkpoint_number, check_interval, options)

    tf.train.CheckpointManager.save = save
    try:
        train(tiny_config(), options, run)
        raise AssertionError("training on a full disk did not fail")
    except WriteError as error:
        assert "ckpt-3" in str(error) and "ckpt-2, is intact" in str(error), error
    finally:
        tf.train.CheckpointManager.save = real_save
    assert not [name for name in os.listdir(checkpoints) if name.startswith("ckpt-3")], os.listdir(checkpoints)
    state = tf.train.get_checkpoint_state(checkpoints)
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-1", "ckpt-2"]
    assert not _leftovers(mount), _leftovers(mount)
    filler.free()

    # Not a byte free: config.json, the average and the export fail whole and leave the old ones.
    filler.fill(room=0)
    config_path = os.path.join(run, "config.json")
    config_before = pathlib.Path(config_path).read_bytes()
    try:
        save_json(config_path, {"model": {}, "run": {}, "padding": "x" * 8192})
        raise AssertionError("writing config.json on a full disk did not fail")
    except WriteError as error:
        assert "previous file is unchanged" in str(error), error
    assert pathlib.Path(config_path).read_bytes() == config_before
    try:
        average_checkpoints(run, last=1)
        raise AssertionError("averaging on a full disk did not fail")
    except WriteError as error:
        assert "is unchanged" in str(error), error
    assert _files(os.path.dirname(averaged)) == average_before
    export = os.path.join(mount, "saved_models", "m", "1")
    try:
        export_run(run, export, request_signatures=False)
        raise AssertionError("exporting on a full disk did not fail")
    except WriteError as error:
        assert "Nothing was written" in str(error), error
    assert not os.path.exists(export)
    assert not _leftovers(mount), _leftovers(mount)
    filler.free()

    # Room again: the same command resumes from ckpt-2.
    summary = train(tiny_config(), options, run)
    assert summary["steps"] == 4, json.dumps(summary)[:500]
    state = tf.train.get_checkpoint_state(checkpoints)
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths][-2:] == ["ckpt-3", "ckpt-4"]
    print("full disk: all checked", flush=True)

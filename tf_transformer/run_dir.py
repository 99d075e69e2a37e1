"""A run directory: what ``tft-train`` writes and every later command reads.

``config.json`` (its format, the model config and the run options), ``sp.model`` (the
shared vocabulary), ``checkpoints/`` (model and optimizer, the last K),
``best/`` and ``best.json`` (the weights of the best dev evaluation, with
``--keep_best_by``), ``averaged/`` (``tft-average``), ``logs/`` (TensorBoard)
and ``data_cache/`` (tokenized data). Training and inference both go through this module, so
neither needs the other to find a config, a vocabulary or a checkpoint.

Training reaches the directory through ``tf.io.gfile``, so it may be a local
or mounted path or one of TensorFlow's filesystems (``gs://bucket/run``);
only the tokenized-data cache stays on a local disk (:func:`data_cache_dir`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence

import tensorflow as tf
from absl import logging
from google.protobuf import text_format
from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState  # the ``checkpoint`` file's proto

import pipelines
from configs import TransformerConfig
from tf_transformer.files import (
    ReadError,
    WriteError,
    copy_file,
    first_line,
    is_local,
    reason,
    remove_leftovers,
    save_json,
    sync_path,
    write_bytes,
)
from tf_transformer.formats import FORMAT_KEY, check_format
from tf_transformer.model import build_transformer


# What reading a truncated or garbled checkpoint raises: TensorFlow checks each tensor's CRC32C
# (DataLossError), its checkpoint reader turns a file that ends too early into an IndexError, and
# a garbled index is "not an sstable". Other errors (permissions, a storage service that is
# briefly unavailable, memory) are not damage: they propagate.
class CheckpointError(ValueError):
    """A checkpoint that cannot be used: damaged, or of another model than the run's config.json."""


_DAMAGE_MESSAGES = ("not an sstable", "bad magic", "checksum", "corrupt", "truncated", "read less bytes")


def is_damaged(error: BaseException) -> bool:
    """Whether ``error``, raised reading a checkpoint, says the checkpoint's files are damaged."""
    if isinstance(error, tf.errors.DataLossError | IndexError):
        return True
    return isinstance(error, tf.errors.OpError | RuntimeError) and any(
        text in str(error).lower() for text in _DAMAGE_MESSAGES
    )


CONFIG_FILE = "config.json"
# The format of a run directory (config.json's keys, the files beside it and what they hold), recorded in
# config.json and checked by every reader (tf_transformer.formats). A change of format bumps this number.
# 2: the model config holds the run settings as used (configs.RUN_SETTINGS), the run part the vocab_size asked.
RUN_FORMAT = 2
VOCABULARY_FILE = "sp.model"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"
BEST = "best"  # the directory of the best checkpoint, and the name commands take for it (--checkpoint best)
BEST_FILE = "best.json"  # which checkpoint of best/ is the best, by which metric, with its value and step
STATE_FILE = "checkpoint"  # TensorFlow's CheckpointManager state: the checkpoints kept, oldest first
_NUMBERED = re.compile(r"^ckpt-(\d+)\.index$")


def save_checkpoint(manager: tf.train.CheckpointManager, step: int) -> str:
    """``manager.save`` as checkpoint ``step``, durably; on failure, no part of it is left and a
    :class:`WriteError` says which checkpoint is still the newest.

    TensorFlow writes a checkpoint's data and index, then lists it in the
    ``checkpoint`` state file; a failed write leaves a ``ckpt-N_temp`` directory or
    unlisted ``ckpt-N.*`` files, which a later save of the same number would
    have to overwrite. Older checkpoints are deleted only after a save succeeds.
    On a local disk the checkpoint's files are flushed (``fsync``) before the
    state file lists them, and the state file before it is renamed into place
    (TensorFlow flushes neither): after a power cut the newest checkpoint listed
    is one the disk holds whole.
    """
    local = is_local(manager.directory)
    if local:
        _record_state_durably(manager)
    options = tf.train.CheckpointOptions(experimental_write_callbacks=[_flush_checkpoint] if local else None)
    try:
        return manager.save(checkpoint_number=step, options=options)
    except (tf.errors.OpError, OSError) as error:
        prefix = os.path.join(manager.directory, f"ckpt-{step}")
        listed = checkpoints(manager.directory)  # what the state file on disk says, whatever the manager thinks
        if prefix not in listed:
            for path in tf.io.gfile.glob(prefix + ".*"):
                tf.io.gfile.remove(path)
            _forget(manager, prefix, listed)
        if tf.io.gfile.exists(prefix + "_temp"):
            tf.io.gfile.rmtree(prefix + "_temp")
        latest = listed[-1] if listed else None
        raise WriteError(
            f"Could not write checkpoint {prefix} ({reason(error)}); is the disk full? "
            + (
                f"The newest checkpoint, {latest}, is intact: free space and run the same command to resume from it"
                if latest
                else "No checkpoint of this run was written yet"
            )
        ) from None


def _flush_checkpoint(prefix: str) -> None:
    """Flushes the files of the checkpoint ``prefix`` and their directory (a write callback of TensorFlow's,
    run after the checkpoint is written and before the manager lists it)."""
    for path in tf.io.gfile.glob(prefix + ".*"):
        sync_path(path)
    sync_path(os.path.dirname(os.path.abspath(prefix)))


def _record_state_durably(manager: tf.train.CheckpointManager) -> None:
    """Makes ``manager`` write its state file through :func:`write_state` (flushed, then renamed).

    TensorFlow's ``CheckpointManager`` records its state in one private method;
    where a TensorFlow version has no such method, its own (unflushed) write stays.
    """
    needed = ("_record_state", "_maybe_delete", "_last_preserved_timestamp")
    if getattr(manager, "_durable_state", False) or not all(hasattr(manager, name) for name in needed):
        return

    def record_state():
        paths, timestamps = zip(*manager._maybe_delete.items(), strict=True)
        write_state(manager.directory, list(paths), list(timestamps), manager._last_preserved_timestamp)

    manager._record_state = record_state
    manager._durable_state = True


def _forget(manager: tf.train.CheckpointManager, prefix: str, listed: list[str]) -> None:
    """After a failed save: ``manager`` no longer counts ``prefix`` (it may have, if only the state failed)."""
    if prefix in getattr(manager, "_maybe_delete", {}):
        del manager._maybe_delete[prefix]
        manager._latest_checkpoint = listed[-1] if listed else None


def write_state(directory: str, paths: list[str], timestamps: list[float], last_preserved: float) -> None:
    """Writes ``directory``'s state file listing the checkpoints ``paths`` (oldest first), as TensorFlow does,
    durably (:func:`tf_transformer.files.write_bytes`)."""
    names = [os.path.basename(path) for path in paths]  # relative to the state file's directory: it may move
    # The proto is built here: TensorFlow's generate_checkpoint_state_proto takes names for paths relative
    # to the working directory when ``directory`` is relative, and would list ``../../ckpt-N``.
    state = CheckpointState(
        model_checkpoint_path=names[-1],
        all_model_checkpoint_paths=names,
        all_model_checkpoint_timestamps=timestamps,
        last_preserved_timestamp=last_preserved,
    )
    write_bytes(os.path.join(directory, STATE_FILE), text_format.MessageToString(state).encode())


def checkpoints(directory: str, repair: bool = False) -> list[str]:
    """The checkpoints of ``directory``, oldest first, as its ``checkpoint`` state file lists them.

    TensorFlow (``tf.train.get_checkpoint_state``, ``CheckpointManager``) takes a
    state file it cannot parse, or cannot read, for no checkpoint at all: a run
    would start again at step 0, rewrite config.json and write over the
    checkpoints of the same numbers. Here a garbled or missing state file gives
    the ``ckpt-N`` checkpoints on disk instead, with a warning (the newest
    readable of them is restored: :func:`restore_newest_readable`); an error
    reading the file (permissions, storage briefly unavailable) is a
    :class:`ReadError`, never "no checkpoint".

    ``repair``: for the process that writes the checkpoints, before its
    ``CheckpointManager`` reads the state file: such a state file is rewritten
    from the checkpoints on disk, and what a killed save left (TensorFlow's
    ``ckpt-N_temp`` directories and state files being written) is removed.
    """
    path = os.path.join(directory, STATE_FILE)
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            data = handle.read()
    except tf.errors.NotFoundError:
        data = None
    except (tf.errors.OpError, OSError) as error:
        raise ReadError(
            f"Could not read {path} ({reason(error)}), the list of this run's checkpoints; not taken for "
            "'no checkpoint' (the run would start again at step 0 and write over them): retry once it can be read"
        ) from None
    if repair:
        _remove_leftovers(directory)
    parsed = _parse_state(data, directory) if data is not None else None
    if parsed is not None:
        listed, state, moved = parsed
        if moved and repair and is_local(directory):  # so that TensorFlow's CheckpointManager finds them too
            times = list(state.all_model_checkpoint_timestamps)
            if len(times) != len(listed):
                times = [os.path.getmtime(p + ".index") for p in listed]
            write_state(directory, listed, times, state.last_preserved_timestamp)
        return listed
    on_disk = _on_disk(directory)
    if on_disk:
        logging.warning(
            "%s %s: using the checkpoints on disk instead (%s)",
            path,
            "is missing" if data is None else "is garbled",
            ", ".join(os.path.basename(p) for p in on_disk),
        )
        if repair and is_local(directory):
            times = [os.path.getmtime(p + ".index") for p in on_disk]
            write_state(directory, on_disk, times, min(times) - 1)
    return on_disk


def _parse_state(data: bytes, directory: str) -> tuple[list[str], CheckpointState, bool] | None:
    """``(paths, state, moved)``: the checkpoint paths a state file lists, oldest first, its proto, and
    whether a listed path was found beside the file instead (:func:`_beside`); ``None`` when it is garbled."""
    state = CheckpointState()
    try:
        text_format.Merge(data.decode("utf-8"), state)
    except (UnicodeDecodeError, text_format.ParseError):
        return None
    if not state.model_checkpoint_path:
        return None
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    paths = [path if os.path.isabs(path) or "://" in path else os.path.join(directory, path) for path in paths]
    found = [_beside(path, directory) for path in paths]
    return found, state, found != paths


def _beside(path: str, directory: str) -> str:
    """``path``, or the checkpoint of its name in ``directory`` where only that one exists: a state file that
    TensorFlow's own writer wrote for a relative directory (:func:`write_state` says why) lists ``../../ckpt-N``."""
    local = os.path.join(directory, os.path.basename(path))
    if local != path and not tf.io.gfile.exists(path + ".index") and tf.io.gfile.exists(local + ".index"):
        return local
    return path


def _on_disk(directory: str) -> list[str]:
    """The ``ckpt-N`` checkpoints in ``directory`` that have an index (written last), by number."""
    if not tf.io.gfile.isdir(directory):
        return []
    numbers = sorted(int(m[1]) for m in map(_NUMBERED.match, tf.io.gfile.listdir(directory)) if m)
    return [os.path.join(directory, f"ckpt-{n}") for n in numbers]


def _remove_leftovers(directory: str) -> None:
    """Removes what a killed save left in a checkpoint directory only its writer writes to."""
    if not is_local(directory) or not os.path.isdir(directory):
        return
    remove_leftovers(directory)
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if re.match(r"^ckpt-\d+_temp$", name) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(f"{STATE_FILE}.tmp"):  # TensorFlow's own state writes
            os.remove(path)


def save_run(model_dir: str, config: TransformerConfig, options: dict, corpus=None) -> None:
    """Writes ``config.json``: :func:`run_record` with :func:`fingerprints` (``corpus``: one corpus, or a
    list of the corpora a run mixes)."""
    save_json(
        os.path.join(model_dir, CONFIG_FILE),
        run_record(config, options, fingerprints=fingerprints(model_dir, corpus)),
    )


def run_record(config: TransformerConfig, options: dict, **extra) -> dict:
    """What ``config.json`` holds: :data:`RUN_FORMAT`, the model config, the run options (a dict) and
    ``extra`` (a trained run's ``fingerprints``, an imported one's ``imported``)."""
    return {FORMAT_KEY: RUN_FORMAT, "model": config.to_dict(), "run": options, **extra}


def fingerprints(model_dir: str, corpus: pipelines.ParallelText | Sequence | None = None) -> dict:
    """What a run trains on, by content: the SHA-256 of each file of ``corpus`` (by name) and of ``sp.model``.

    ``corpus`` may be a list of corpora (``--data`` repeated): one alone is named as a corpus is, several
    by their place and name (``1:train.en``, ``2:train.en``), as their files may share names.

    Hashes of the bytes, not sizes and modification times: a corpus copied to
    another disk or machine (or touched) is the same corpus, and one edited in
    place is not, whatever its times say. Reading is cheap next to training
    (SHA-256 runs at about a gigabyte a second: a second or two for WMT14), and
    a file unchanged since it was last hashed in this process is not read again.
    """
    values = {}
    corpora = [corpus] if isinstance(corpus, pipelines.ParallelText) else list(corpus or [])
    if corpora:
        values["corpus"] = {
            (f"{number}:" if len(corpora) > 1 else "") + os.path.basename(path): _sha256(path)
            for number, one in enumerate(corpora, start=1)
            for path in one.paths
        }
    vocabulary = vocabulary_path(model_dir)
    if tf.io.gfile.exists(vocabulary):
        values["vocabulary"] = _sha256(vocabulary)
    if tf.io.gfile.exists(pipelines.target_model_beside(vocabulary)):
        values["target_vocabulary"] = _sha256(pipelines.target_model_beside(vocabulary))
    return values


_HASHES: dict = {}


def _sha256(path: str) -> str:
    key = path
    if is_local(path):  # the ctime changes with every write, even one that sets the mtime back
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _HASHES or not is_local(path):
        digest = hashlib.sha256()
        with tf.io.gfile.GFile(path, "rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def read_config(model_dir: str) -> dict:
    """``model_dir/config.json`` as written, refused (:class:`~tf_transformer.formats.FormatError`) unless it
    records :data:`RUN_FORMAT`."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} not found: is {model_dir!r} a model directory written by tft-train?")
    with tf.io.gfile.GFile(path) as handle:
        stored = json.loads(handle.read())
    remedy = "train it again with this version, or use it with the version that wrote it"
    check_format(stored, path, "run directory", RUN_FORMAT, remedy)
    return stored


def stored_fingerprints(model_dir: str) -> dict:
    """The :func:`fingerprints` ``config.json`` records (none for an imported model)."""
    return read_config(model_dir).get("fingerprints", {})


def load_run(model_dir: str) -> tuple[TransformerConfig, dict]:
    """The model config and run options stored in ``model_dir/config.json``."""
    stored = read_config(model_dir)
    return TransformerConfig.from_dict(stored["model"]), stored["run"]


def vocabulary_path(model_dir: str) -> str:
    return os.path.join(model_dir, VOCABULARY_FILE)


def checkpoint_dir(model_dir: str) -> str:
    return os.path.join(model_dir, CHECKPOINTS)


def data_cache_dir(model_dir: str) -> str:
    """Where the run's tokenized data is cached: ``model_dir/data_cache``, on a local or mounted disk.

    ``pipelines`` writes the cache with local file calls (a directory renamed
    into place), so for a ``model_dir`` such as ``gs://bucket/run`` each
    machine keeps it in ``$TFT_DATA_CACHE`` (default
    ``~/.cache/tf_transformer/data``); its key covers the corpus and the
    vocabulary, so runs may share it.
    """
    if is_local(model_dir):
        return os.path.join(model_dir, "data_cache")
    default = os.path.join(os.path.expanduser("~"), ".cache", "tf_transformer", "data")
    return os.environ.get("TFT_DATA_CACHE") or default


def make_vocabulary(
    model_dir: str,
    corpus: pipelines.ParallelText,
    size: int,
    model_type: str = "bpe",
    seed: int = 1,
    text=None,
    symbols: Sequence[str] = (),
    symbol_pattern: str | None = None,
) -> pipelines.Tokenizer:
    """The run's tokenizer: ``model_dir/sp.model`` if there is one (a resumed run, or the user's), else one
    trained on both sides of ``corpus`` (section 5.1: a shared source-target vocabulary).

    A task may train it on other ``text`` pairs (a parser's: the words only) and
    add ``symbols`` held whole; ``symbol_pattern``: see :class:`pipelines.Tokenizer`.
    """
    path = vocabulary_path(model_dir)
    if not tf.io.gfile.exists(path):
        logging.info("Training a shared %s vocabulary of %d pieces on %s", model_type, size, corpus.paths)
        with tempfile.TemporaryDirectory() as local:  # SentencePiece writes a local file: then copied with gfile
            trained = os.path.join(local, VOCABULARY_FILE)
            pipelines.train_sentencepiece(
                corpus.pairs() if text is None else text,
                trained,
                vocab_size=size,
                model_type=model_type,
                seed=seed,
                user_defined_symbols=symbols,
            )
            tf.io.gfile.makedirs(model_dir)
            copy_file(trained, path)
    return pipelines.Tokenizer(path, symbol_pattern=symbol_pattern)


def default_checkpoint(model_dir: str) -> str:
    """The checkpoint commands load when none is named: the averaged one if it is current, else the newest.

    ``tft-average`` writes ``averaged/ckpt`` and the checkpoints it averaged in
    ``averaged/SOURCES``. Once training has gone on, that average holds older
    weights than the newest checkpoint: it is then passed over with a warning.
    """
    listed = checkpoints(checkpoint_dir(model_dir))
    latest = listed[-1] if listed else None
    averaged = os.path.join(model_dir, AVERAGED, "ckpt")
    if tf.io.gfile.exists(averaged + ".index"):
        sources = os.path.join(model_dir, AVERAGED, "SOURCES")
        names = []
        if tf.io.gfile.exists(sources):
            with tf.io.gfile.GFile(sources) as handle:
                names = [os.path.basename(line.strip()) for line in handle if line.strip()]
        if latest is None or (names and names[-1] == os.path.basename(latest)):
            return averaged
        logging.warning(
            "%s averages %s, but %s is newer: loading the newest (run tft-average again to average it)",
            averaged,
            ", ".join(names) or "unknown checkpoints",
            latest,
        )
    if latest is None:
        raise FileNotFoundError(f"No checkpoint in {checkpoint_dir(model_dir)} (and no {averaged})")
    return latest


def best_dir(model_dir: str) -> str:
    return os.path.join(model_dir, BEST)


def best_checkpoint(model_dir: str) -> str:
    """The checkpoint of the run's best dev evaluation, as ``best.json`` names it (``tft-train --keep_best_by``).

    Between saving a new best and writing ``best.json`` (a moment), the file still
    names the previous best, already replaced: the newest checkpoint of ``best/``
    is then the best, with a warning.
    """
    marker = os.path.join(model_dir, BEST_FILE)
    if not tf.io.gfile.exists(marker):
        raise FileNotFoundError(
            f"{model_dir} has no best checkpoint (no {BEST_FILE}): train with --keep_best_by (or --early_stopping) "
            "to keep one, or name another checkpoint"
        )
    with tf.io.gfile.GFile(marker) as handle:
        recorded = json.loads(handle.read())
    path = os.path.join(model_dir, recorded["checkpoint"])
    if tf.io.gfile.exists(path + ".index"):
        return path
    listed = checkpoints(best_dir(model_dir))
    if not listed:
        raise FileNotFoundError(f"{marker} names {path}, which is missing, and {best_dir(model_dir)} holds none")
    logging.warning("%s names %s, which is gone: using %s, saved as a newer best", marker, path, listed[-1])
    return listed[-1]


def resolve_checkpoint(model_dir: str, name: str | None) -> str:
    """The checkpoint a command's ``--checkpoint`` names: none for :func:`default_checkpoint`, ``best`` for
    :func:`best_checkpoint`, else the prefix given."""
    if not name:
        return default_checkpoint(model_dir)
    if name == BEST:
        return best_checkpoint(model_dir)
    return name


def restore_model(model_dir: str, checkpoint_path: str | None = None):
    """Rebuilds the model of ``model_dir`` and loads a checkpoint (:func:`default_checkpoint` by default,
    ``best``: :func:`best_checkpoint`).

    Strict (:func:`load_weights`). Returns ``(model, config)``.
    """
    config, _ = load_run(model_dir)
    model = build_transformer(config)
    path = resolve_checkpoint(model_dir, checkpoint_path)
    load_weights(model, path, model_dir, config)
    return model, config


def load_weights(model, path: str, model_dir: str, config: TransformerConfig) -> None:
    """Loads the model weights of the checkpoint at ``path`` (a training checkpoint or an average).

    Strict: every weight of the model ``config.json`` describes must be in the
    checkpoint, with its shape, or a :class:`CheckpointError` names the mismatch
    (a checkpoint of another model would leave weights at their random start);
    a damaged checkpoint is a :class:`CheckpointError` too.
    """
    if not tf.io.gfile.exists(path + ".index"):
        raise FileNotFoundError(f"No checkpoint {path} (its .index file is missing)")
    try:
        tf.train.Checkpoint(model=model).read(path).assert_existing_objects_matched().expect_partial()
    except (tf.errors.OpError, IndexError, RuntimeError) as error:
        if not is_damaged(error):
            raise
        raise CheckpointError(
            f"{path} is damaged and cannot be read ({first_line(error)}): name an earlier checkpoint "
            f"of {checkpoint_dir(model_dir)} (tft-export --checkpoint), or train on to write a new one"
        ) from None
    except (AssertionError, ValueError) as error:
        raise CheckpointError(
            f"{path} does not match the model of {os.path.join(model_dir, CONFIG_FILE)} ({config.name}): "
            f"{first_line(error)}"
        ) from None
    logging.info("Loaded %s", path)


def restore_newest_readable(checkpoint, manager: tf.train.CheckpointManager) -> str | None:
    """Restores the newest of ``manager``'s checkpoints that reads whole, warning about each damaged one.

    ``checkpoint`` is the ``tf.train.Checkpoint`` to restore into, or a function
    of the checkpoint's path giving it (what a checkpoint holds varies by version).

    A run killed while writing, or a disk that garbled a file, leaves a newest
    checkpoint that cannot be read; training then resumes from the one before.
    Returns the path restored (``None`` when there is no checkpoint yet).
    """
    for path in reversed(manager.checkpoints):
        try:
            target = checkpoint(path) if callable(checkpoint) else checkpoint
            target.restore(path).assert_existing_objects_matched()
            return path
        except (tf.errors.OpError, IndexError, RuntimeError) as error:
            if not is_damaged(error):
                raise
            logging.warning("%s is damaged (%s): resuming from the checkpoint before it", path, first_line(error))
    if manager.checkpoints:
        raise CheckpointError(f"No readable checkpoint in {manager.directory}: every one is damaged")
    return None

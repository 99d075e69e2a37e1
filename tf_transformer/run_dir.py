"""A run directory: what ``tft-train`` writes and every later command reads.

``config.json`` (the model config and the run options), ``sp.model`` (the
shared vocabulary), ``checkpoints/`` (model and optimizer, the last K),
``averaged/`` (``tft-average``), ``logs/`` (TensorBoard) and ``data_cache/``
(tokenized data). Training and inference both go through this module, so
neither needs the other to find a config, a vocabulary or a checkpoint.

Training reaches the directory through ``tf.io.gfile``, so it may be a local
or mounted path or one of TensorFlow's filesystems (``gs://bucket/run``);
only the tokenized-data cache stays on a local disk (:func:`data_cache_dir`).
"""

from __future__ import annotations

import json
import os
import tempfile

import tensorflow as tf
from absl import logging

import pipelines
from configs import TransformerConfig
from configs.run import renamed_options
from tf_transformer.files import WriteError, copy_file, first_line, reason, save_json
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
VOCABULARY_FILE = "sp.model"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"


def save_checkpoint(manager: tf.train.CheckpointManager, step: int) -> str:
    """``manager.save`` as checkpoint ``step``; on failure, no part of it is left and a :class:`WriteError` says
    which checkpoint is still the newest.

    TensorFlow writes a checkpoint's data and index, then lists it in the
    ``checkpoint`` file; a failed write leaves a ``ckpt-N_temp`` directory or
    unlisted ``ckpt-N.*`` files, which a later save of the same number would
    have to overwrite. Older checkpoints are deleted only after a save succeeds.
    """
    try:
        return manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as error:
        prefix = os.path.join(manager.directory, f"ckpt-{step}")
        if prefix not in manager.checkpoints:
            for path in tf.io.gfile.glob(prefix + ".*"):
                tf.io.gfile.remove(path)
        if tf.io.gfile.exists(prefix + "_temp"):
            tf.io.gfile.rmtree(prefix + "_temp")
        latest = manager.latest_checkpoint
        raise WriteError(
            f"Could not write checkpoint {prefix} ({reason(error)}); is the disk full? "
            + (
                f"The newest checkpoint, {latest}, is intact: free space and run the same command to resume from it"
                if latest
                else "No checkpoint of this run was written yet"
            )
        ) from None


def save_run(model_dir: str, config: TransformerConfig, options: dict) -> None:
    """Writes ``config.json``: the model config and the run options (a dict)."""
    save_json(os.path.join(model_dir, CONFIG_FILE), {"model": config.to_dict(), "run": options})


def load_run(model_dir: str) -> tuple[TransformerConfig, dict]:
    """The model config and run options stored in ``model_dir/config.json``, under today's names
    (a file of an earlier version loads: :data:`configs.transformer.RENAMED_FIELDS`,
    :data:`configs.run.RENAMED_OPTIONS`)."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} not found: is {model_dir!r} a model directory written by tft-train?")
    with tf.io.gfile.GFile(path) as handle:
        stored = json.loads(handle.read())
    return TransformerConfig.from_dict(stored["model"]), renamed_options(stored["run"])


def vocabulary_path(model_dir: str) -> str:
    return os.path.join(model_dir, VOCABULARY_FILE)


def checkpoint_dir(model_dir: str) -> str:
    return os.path.join(model_dir, CHECKPOINTS)


def is_local(path: str) -> bool:
    """Whether ``path`` is a local or mounted path, not one of TensorFlow's filesystems (``gs://``, ``ram://``)."""
    return "://" not in path


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
    model_dir: str, corpus: pipelines.ParallelText, size: int, model_type: str = "bpe", seed: int = 1
) -> pipelines.Tokenizer:
    """The run's tokenizer: ``model_dir/sp.model`` if there is one (a resumed run, or the user's), else one
    trained on both sides of ``corpus`` (section 5.1: a shared source-target vocabulary)."""
    path = vocabulary_path(model_dir)
    if not tf.io.gfile.exists(path):
        logging.info("Training a shared %s vocabulary of %d pieces on %s", model_type, size, corpus.paths)
        with tempfile.TemporaryDirectory() as local:  # SentencePiece writes a local file: then copied with gfile
            trained = os.path.join(local, VOCABULARY_FILE)
            pipelines.train_sentencepiece(corpus.pairs(), trained, vocab_size=size, model_type=model_type, seed=seed)
            tf.io.gfile.makedirs(model_dir)
            copy_file(trained, path)
    return pipelines.Tokenizer(path)


def default_checkpoint(model_dir: str) -> str:
    """The checkpoint commands load when none is named: the averaged one if it is current, else the newest.

    ``tft-average`` writes ``averaged/ckpt`` and the checkpoints it averaged in
    ``averaged/SOURCES``. Once training has gone on, that average holds older
    weights than the newest checkpoint: it is then passed over with a warning.
    """
    latest = tf.train.latest_checkpoint(checkpoint_dir(model_dir))
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


def restore_model(model_dir: str, checkpoint_path: str | None = None):
    """Rebuilds the model of ``model_dir`` and loads a checkpoint (:func:`default_checkpoint` by default).

    Strict (:func:`load_weights`). Returns ``(model, config)``.
    """
    config, _ = load_run(model_dir)
    model = build_transformer(config)
    path = checkpoint_path or default_checkpoint(model_dir)
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
            f"{path} does not match the model of {os.path.join(model_dir, CONFIG_FILE)} ({config.name}, "
            f"{config.num_layers} layers, d_model {config.d_model}): {first_line(error)}"
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

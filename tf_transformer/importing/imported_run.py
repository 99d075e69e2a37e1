"""Writes an imported model as a run directory that every command reads as one of ours.

The directory holds what ``tft-train`` writes for inference and fine-tuning:
``config.json`` (the run-directory format; the model config; the run's task; where the model came from),
``sp.model`` and ``sp.target.model`` (the two SentencePiece models, renumbered
to one id map: :mod:`tf_transformer.importing.vocabulary`) and
``checkpoints/ckpt-0`` (the model's weights). It is written beside its
destination and renamed into place whole: a failed import leaves nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile

import tensorflow as tf

from tf_transformer.files import replace_directory, save_json, staging_directory, write_bytes, write_failed
from tf_transformer.importing import marian, marian_npz
from tf_transformer.model import build_transformer
from tf_transformer.run_dir import CONFIG_FILE, VOCABULARY_FILE, checkpoint_dir, run_record


def read_opus_mt(source: str) -> marian.MarianCheckpoint:
    """The OPUS-MT model in the directory ``source``: Hugging Face's layout (``config.json``) or Marian's
    (``decoder.yml``, a model ``.npz``); or in a ``.zip`` of either, such as an OPUS-MT release."""
    if os.path.isfile(source) and zipfile.is_zipfile(source):
        return _read_zip(source)
    if not os.path.isdir(source):
        raise marian.ModelImportError(
            f"{source} is neither a directory nor a zip file: --source is a model's directory or its .zip"
        )
    if os.path.exists(os.path.join(source, "config.json")):
        return marian.read_checkpoint(source)
    if marian_npz.is_marian_directory(source):
        return marian_npz.read_marian_checkpoint(source)
    raise marian.ModelImportError(
        f"{source} holds neither Hugging Face's layout of an OPUS-MT model (config.json, model.safetensors) "
        "nor Marian's (decoder.yml, a model .npz)"
    )


def _read_zip(path: str) -> marian.MarianCheckpoint:
    """:func:`read_opus_mt` of the zip ``path``, unpacked to a temporary directory (named ``path:`` in errors);
    a zip holding one folder is read inside it."""
    with tempfile.TemporaryDirectory(prefix="tft-import-") as unpacked:
        try:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(unpacked)  # member names are made safe by zipfile (no "..", no absolute paths)
        except (zipfile.BadZipFile, OSError) as error:
            raise marian.ModelImportError(f"{path}: cannot unpack it ({error})") from None
        root = unpacked
        entries = os.listdir(root)
        if len(entries) == 1 and os.path.isdir(os.path.join(root, entries[0])):
            root = os.path.join(root, entries[0])

        def named(text: str) -> str:
            return text.replace(unpacked + os.sep, f"{path}:").replace(unpacked, path)

        try:
            checkpoint = read_opus_mt(root)
        except marian.ModelImportError as error:
            raise marian.ModelImportError(named(str(error))) from None
    checkpoint.directory = path
    checkpoint.config_file, checkpoint.weights_file = named(checkpoint.config_file), named(checkpoint.weights_file)
    return checkpoint


def import_opus_mt(
    source: str, model_dir: str, position_timescales: str = "tensor2tensor", overwrite: bool = False
) -> str:
    """Imports the OPUS-MT model directory ``source`` (:func:`read_opus_mt`) as the run ``model_dir``.

    ``position_timescales``: see :mod:`tf_transformer.importing.marian` (Marian's, the default, or
    ``"paper"`` for Hugging Face's port). An existing ``model_dir`` is refused unless ``overwrite``.
    Returns ``model_dir``.
    """
    if os.path.exists(model_dir) and not overwrite:
        raise FileExistsError(f"{model_dir} exists: choose a new directory, or pass --overwrite to replace it")
    checkpoint = read_opus_mt(source)
    config = marian.transformer_config(checkpoint, position_timescales)
    source_model, target_model = marian.vocabulary_models(checkpoint)
    model = build_transformer(config, dtype="float32")
    marian.load_into(model, checkpoint, config)
    staging = staging_directory(model_dir)
    try:
        write_bytes(os.path.join(staging, VOCABULARY_FILE), source_model)
        write_bytes(os.path.join(staging, "sp.target.model"), target_model)
        run = {"data": None, "task": "translation", "src": None, "tgt": None}
        imported = {"from": os.path.abspath(source), "format": checkpoint.format}
        save_json(os.path.join(staging, CONFIG_FILE), run_record(config, run, imported=imported))
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), checkpoint_dir(staging), max_to_keep=1)
        manager.save(checkpoint_number=0)
        replace_directory(staging, model_dir)
    except (tf.errors.OpError, OSError) as error:
        raise write_failed("imported run", model_dir, error, os.path.exists(model_dir)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return model_dir

"""A run directory: what ``tft-train`` writes and every later command reads.

``config.json`` (the model config and the run options), ``sp.model`` (the
shared vocabulary), ``checkpoints/`` (model and optimizer, the last K),
``averaged/`` (``tft-average``), ``logs/`` (TensorBoard) and ``data_cache/``
(tokenized data). Training and inference both go through this module, so
neither needs the other to find a config, a vocabulary or a checkpoint.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf
from absl import logging

import pipelines
from configs import TransformerConfig
from tf_transformer.model import build_transformer

CONFIG_FILE = "config.json"
VOCABULARY_FILE = "sp.model"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"


def save_json(path: str, value) -> None:
    """Writes ``value`` as JSON to ``path`` atomically (a temporary file, then a rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def save_run(model_dir: str, config: TransformerConfig, options: dict) -> None:
    """Writes ``config.json``: the model config and the run options (a dict)."""
    save_json(os.path.join(model_dir, CONFIG_FILE), {"model": config.to_dict(), "run": options})


def load_run(model_dir: str) -> tuple[TransformerConfig, dict]:
    """The model config and run options stored in ``model_dir/config.json``."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {model_dir!r} a model directory written by tft-train?")
    with open(path) as handle:
        stored = json.load(handle)
    return TransformerConfig.from_dict(stored["model"]), stored["run"]


def vocabulary_path(model_dir: str) -> str:
    return os.path.join(model_dir, VOCABULARY_FILE)


def checkpoint_dir(model_dir: str) -> str:
    return os.path.join(model_dir, CHECKPOINTS)


def make_vocabulary(
    model_dir: str, corpus: pipelines.ParallelText, size: int, model_type: str = "bpe", seed: int = 1
) -> pipelines.Tokenizer:
    """The run's tokenizer: ``model_dir/sp.model`` if there is one (a resumed run, or the user's), else one
    trained on both sides of ``corpus`` (section 5.1: a shared source-target vocabulary)."""
    path = vocabulary_path(model_dir)
    if not os.path.exists(path):
        logging.info("Training a shared %s vocabulary of %d pieces on %s", model_type, size, corpus.paths)
        pipelines.train_sentencepiece(corpus.pairs(), path, vocab_size=size, model_type=model_type, seed=seed)
    return pipelines.Tokenizer(path)


def default_checkpoint(model_dir: str) -> str:
    """The averaged checkpoint when ``tft-average`` wrote one, else the newest."""
    averaged = os.path.join(model_dir, AVERAGED, "ckpt")
    if tf.io.gfile.exists(averaged + ".index"):
        return averaged
    latest = tf.train.latest_checkpoint(checkpoint_dir(model_dir))
    if latest is None:
        raise FileNotFoundError(f"No checkpoint in {checkpoint_dir(model_dir)} (and no {averaged})")
    return latest


def restore_model(model_dir: str, checkpoint_path: str | None = None):
    """Rebuilds the model of ``model_dir`` and loads a checkpoint (the newest by default): ``(model, config)``."""
    config, _ = load_run(model_dir)
    model = build_transformer(config)
    path = checkpoint_path or tf.train.latest_checkpoint(checkpoint_dir(model_dir))
    if path is None:
        raise FileNotFoundError(f"No checkpoint in {checkpoint_dir(model_dir)}")
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    return model, config


def checkpoint_weights(model, path: str) -> list[np.ndarray]:
    """The model weights stored in the checkpoint at ``path``, as ``model.get_weights()`` orders them."""
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    return [np.array(w) for w in model.get_weights()]

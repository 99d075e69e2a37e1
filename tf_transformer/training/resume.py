"""What a run needs to continue exactly where it stopped: the checkpoint's contents.

A resumed run must make the same updates as an uninterrupted one. Three things
decide them: the weights and optimizer state (Adam's moments, the step, the
gradient accumulators, the loss scale under ``mixed_float16``), the batches
(a function of the seed and of the micro-batches taken so far, which the
checkpoint counts itself: under ``mixed_float16`` a skipped step uses a batch
without moving the optimizer's step), and the dropout masks (section 5.4).
Keras draws those from each ``Dropout`` layer's seed generator, whose state is
a variable of the layer but not one of its weights: without it in the
checkpoint, a resumed run draws the masks of step 0 again.

The same module checks that a resumed run keeps the options that decide its
batches and schedule, and starts new runs from another run's weights
(``--init_from``).
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf
from absl import logging

from configs import TransformerConfig
from tf_transformer import run_dir
from tf_transformer.files import copy_file
from tf_transformer.training.options import STREAM_OPTIONS, config_differences, differences, effective

SEEDS = "dropout_seeds"
POSITION = "data_position"
_PARTS = ("model", "optimizer", SEEDS, POSITION)

# Model config fields a run started from another run's weights may change
# (fine-tuning); every other field must match, or the weights mean something else.
TRAINING_FIELDS = frozenset(
    {
        "name",
        "dropout",
        "attention_dropout",
        "relu_dropout",
        "label_smoothing",
        "warmup_steps",
        "learning_rate_scale",
        "train_steps",
        "tokens_per_batch",
        "max_train_length",
        "beam_size",
        "alpha",
        "max_extra_length",
    }
)


class ResumeError(ValueError):
    """A run directory cannot be resumed (or started from) as asked; the message says why and what to do."""


def check_unchanged(model_dir: str, config: TransformerConfig, run: dict) -> None:
    """Refuses to resume ``model_dir`` with options that would change its data stream or schedule.

    Every changed option is named with its old and new value. Options the stored
    run does not record (older runs) are not compared.
    """
    stored_config, stored_run = run_dir.load_run(model_dir)
    compared = [
        name for name in STREAM_OPTIONS if name in stored_run or name in ("tokens_per_batch", "max_train_length")
    ]
    changed = [
        f"--{name} {old} → {new}"
        for name, old, new in differences(effective(stored_config, stored_run), effective(config, run), compared)
    ]
    if changed:
        raise ResumeError(
            f"{model_dir} holds checkpoints of a run with other options: {'; '.join(changed)}. "
            "Resuming with them would train on other batches or another learning-rate schedule. "
            "Rerun with the run's own options to resume it, or start a new run from its weights "
            f"with a new schedule: --model_dir NEW_DIR --init_from {model_dir}"
        )


def source_run(path: str) -> tuple[str, str]:
    """``(run directory, checkpoint)`` for ``--init_from``: a run directory (its default checkpoint),
    or a checkpoint prefix inside one (``RUN/checkpoints/ckpt-N``, ``RUN/averaged/ckpt``)."""
    if tf.io.gfile.exists(os.path.join(path, run_dir.CONFIG_FILE)):
        return path, run_dir.default_checkpoint(path)
    directory = os.path.dirname(os.path.dirname(os.path.abspath(path) if run_dir.is_local(path) else path))
    if not tf.io.gfile.exists(path + ".index"):
        raise ResumeError(f"--init_from {path}: no such run directory or checkpoint (no {path}.index)")
    if not tf.io.gfile.exists(os.path.join(directory, run_dir.CONFIG_FILE)):
        raise ResumeError(f"--init_from {path}: no {run_dir.CONFIG_FILE} in {directory}, the run it belongs to")
    return directory, path


def take_vocabulary(model_dir: str, source_dir: str) -> None:
    """Gives ``model_dir`` the vocabulary of the run its weights come from: the embeddings are indexed by
    its pieces. A vocabulary already in ``model_dir`` must be the same file."""
    source, target = run_dir.vocabulary_path(source_dir), run_dir.vocabulary_path(model_dir)
    if not tf.io.gfile.exists(target):
        tf.io.gfile.makedirs(model_dir)
        copy_file(source, target)
        return
    with tf.io.gfile.GFile(source, "rb") as a, tf.io.gfile.GFile(target, "rb") as b:
        if a.read() != b.read():
            raise ResumeError(
                f"--init_from: {target} differs from {source}, the vocabulary the weights were trained with; "
                f"remove {target} to use the source run's"
            )


def check_architecture(config: TransformerConfig, source_config: TransformerConfig, source_dir: str) -> None:
    """The model config may differ from the source run's only in training fields (:data:`TRAINING_FIELDS`)."""
    differing = [
        f"{name} {old} → {new}" for name, old, new in config_differences(source_config, config, TRAINING_FIELDS)
    ]
    if differing:
        raise ResumeError(
            f"--init_from {source_dir}: the model differs from that run's ({'; '.join(differing)}); "
            "start from a run of the same architecture"
        )


def dropout_seeds(model: keras.Model) -> list:
    """The state variables of the model's seed generators, in the model's layer order.

    A list, not a mapping by name: Keras numbers seed generators per process
    (``seed_generator_7``), while the layer order is fixed by the config.
    """
    weights = {id(weight) for weight in model.weights}
    return [v for v in model.variables if id(v) not in weights and v.path.endswith("seed_generator_state")]


def training_checkpoint(
    model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None, data_position: tf.Variable | None = None
) -> tf.train.Checkpoint:
    """The checkpoint of a training run: model, optimizer (the compiled one by default), the dropout state
    and the micro-batches taken from the data (``DataPosition.batches``)."""
    parts = {"model": model, "optimizer": optimizer or model.optimizer, SEEDS: dropout_seeds(model)}
    if data_position is not None:
        parts[POSITION] = data_position
    return tf.train.Checkpoint(**parts)


def restorable(checkpoint: tf.train.Checkpoint, path: str) -> tf.train.Checkpoint:
    """``checkpoint``, or for a checkpoint written by an older version the part of it that ``path`` holds.

    Without the dropout state a run resumes with other dropout masks (a warning
    says so); without the data position it continues at the optimizer's step.
    """
    parts = {name: getattr(checkpoint, name) for name in _PARTS if hasattr(checkpoint, name)}
    missing = [name for name in (SEEDS, POSITION) if name in parts and not holds(path, name)]
    if not missing:
        return checkpoint
    if SEEDS in missing:
        logging.warning(
            "%s holds no dropout random state (written by an older version): training resumes, "
            "but its dropout masks, and so its weights, will differ from an uninterrupted run's",
            path,
        )
    return tf.train.Checkpoint(**{name: value for name, value in parts.items() if name not in missing})


def holds(path: str, part: str) -> bool:
    """Whether the checkpoint at ``path`` holds ``part`` (e.g. :data:`POSITION`; older ones do not)."""
    # The reader of the prefix itself: load_checkpoint would take a prefix that a filesystem lists as a
    # directory (ram:// lists every prefix of a file name) for a directory of checkpoints.
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    return any(key.startswith(f"{part}/") for key in reader.get_variable_to_shape_map())

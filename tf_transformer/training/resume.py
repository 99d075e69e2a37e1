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

The same module checks that a resumed run keeps the options and inputs that
decide its batches, its schedule and the shape of its checkpoint, keeps its
own precision where ``--precision auto`` would pick another on this machine,
and starts new runs from another run's weights (``--init_from``).
"""

from __future__ import annotations

import dataclasses
import os

import keras
import tensorflow as tf
from absl import logging

from configs import RUN_SETTINGS, TransformerConfig
from pipelines import target_model_beside
from tf_transformer import run_dir
from tf_transformer.files import copy_file
from tf_transformer.training.options import (
    STREAM_OPTIONS,
    OptionError,
    Resolved,
    check,
    config_differences,
    differences,
    effective,
    loss_scaled,
)
from tf_transformer.training.strategy import set_precision

SEEDS = "dropout_seeds"
POSITION = "data_position"
BEST = "best"  # training.best.BestState: the best dev value, its step, the evaluations since
HORIZON = "schedule_horizon"  # --schedule budget: the update at which the learning rate reaches zero
_PARTS = ("model", "optimizer", SEEDS, POSITION, BEST, HORIZON)

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
        *RUN_SETTINGS,
        "beam_size",
        "alpha",
        "max_extra_length",
    }
)


class ResumeError(ValueError):
    """A run directory cannot be resumed (or started from) as asked; the message says why and what to do."""


def check_unchanged(model_dir: str, config: TransformerConfig, run: dict, corpus=None) -> None:
    """Refuses to resume ``model_dir`` with options or inputs that would change its data stream, its schedule
    or the shape of its checkpoint; called before anything of the run is written.

    Compared: :data:`STREAM_OPTIONS`, the precision where it changes the optimizer's checkpoint
    (:func:`~tf_transformer.training.options.loss_scaled`), and by content
    (:func:`run_dir.fingerprints`) the files of ``corpus`` (one, or a list) and ``sp.model``.
    Every change is named with its old and new value and the flag that sets it.
    """
    stored_config, stored_run = run_dir.load_run(model_dir)
    changed = [
        _change(name, old, new)
        for name, old, new in differences(effective(stored_config, stored_run), effective(config, run), STREAM_OPTIONS)
    ]
    old, new = stored_run.get("precision"), run.get("precision")
    if old and loss_scaled(old) != loss_scaled(new):
        changed.append(
            f"--precision {old} → {new} (the optimizer of a mixed_float16 run is Keras's LossScaleOptimizer, "
            "whose checkpoint holds other objects: float32 and mixed_bfloat16 may take each other's place, "
            "mixed_float16 neither)"
        )
    changed += _changed_inputs(model_dir, corpus)
    if changed:
        raise ResumeError(
            f"{model_dir} holds checkpoints of a run with other options: {'; '.join(changed)}. "
            "Resuming with them would train on other batches or another learning-rate schedule, or could not "
            "load the checkpoint. Rerun with the run's own options to resume it, or start a new run from its "
            f"weights with a new schedule: --model_dir NEW_DIR --init_from {model_dir}"
        )


def _change(name: str, old, new) -> str:
    if name == "num_replicas":  # no flag of its own
        return f"the number of replicas {old} → {new} (set by --strategy and the devices it finds)"
    if name == "data_weights":  # None: in proportion to the corpora's sizes
        return f"--data_weights {_weights(old)} → {_weights(new)}"
    return f"--{name} {old} → {new}"


def _weights(weights) -> str:
    return ",".join(f"{w:g}" for w in weights) if weights else "(none: by the corpora's sizes)"


def _changed_inputs(model_dir: str, corpus) -> list[str]:
    """The corpus files and the vocabulary whose bytes differ from those the run recorded."""
    stored = run_dir.stored_fingerprints(model_dir)
    changed = []
    if "corpus" in stored and corpus is not None:
        now = run_dir.fingerprints(model_dir, corpus)["corpus"]
        changed += [
            f"--data: {name} is not the file the run trained on (SHA-256 {_short(digest)} → {_short(now.get(name))})"
            for name, digest in stored["corpus"].items()
            if now.get(name) != digest
        ]
    if "vocabulary" in stored:
        path = run_dir.vocabulary_path(model_dir)
        now = run_dir.fingerprints(model_dir).get("vocabulary")
        if now is None:
            changed.append(f"{path} is missing: put back the vocabulary the run trained with")
        elif now != stored["vocabulary"]:
            changed.append(
                f"{path} is not the vocabulary the run trained with (SHA-256 {_short(stored['vocabulary'])} → "
                f"{_short(now)}): put the run's own back (its embeddings are indexed by its pieces), or train "
                "with this one in a new --model_dir"
            )
    return changed


def _short(digest: str | None) -> str:
    return digest[:12] + "…" if digest else "none"


def keep_run_defaults(model_dir: str, resolved: Resolved, strategy: tf.distribute.Strategy) -> Resolved:
    """On resume, the options the machine decided (``--precision auto``, no ``--jit_compile``) take the run's own
    values (config.json) where those still work here; the precision is then set as the run's.

    ``auto`` resolves per machine (:func:`~tf_transformer.training.options.choose_precision`):
    a run moved to other hardware would otherwise change precision, or change
    ``jit_compile`` and with it the batches, on its own. An option given on the
    command line is left as given (and refused by :func:`check_unchanged` if it
    changes what must not change). Where the run's own value does not work here
    (:func:`~tf_transformer.training.options.check`), the machine's stays, with
    a warning. Returns ``resolved`` unchanged for a new run.
    """
    if not resolved.defaulted or not tf.io.gfile.exists(os.path.join(model_dir, run_dir.CONFIG_FILE)):
        return resolved
    if not run_dir.checkpoints(run_dir.checkpoint_dir(model_dir)):
        return resolved
    _, stored = run_dir.load_run(model_dir)
    options, reason = resolved.options, resolved.precision_reason
    for name in resolved.defaulted:
        value = stored.get(name)
        if value is None or value == "auto" or value == getattr(options, name):
            continue
        candidate = dataclasses.replace(options, **{name: value})
        try:
            check(candidate, strategy)
        except OptionError as error:
            logging.warning(
                "The run's own %s=%s does not work here (%s): %s", name, value, error, getattr(options, name)
            )
            continue
        if name == "precision":
            reason = f"the run's own, kept on resume (auto would take {options.precision} here: {reason})"
        options = candidate
    if options is resolved.options:
        return resolved
    set_precision(options.precision)
    return Resolved(options, reason, resolved.defaulted)


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
        if tf.io.gfile.exists(target_model_beside(source)):  # an imported model's target side: first
            copy_file(target_model_beside(source), target_model_beside(target))
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
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer | None = None,
    data_position: tf.Variable | None = None,
    best: tf.Module | None = None,
    horizon: tf.Variable | None = None,
) -> tf.train.Checkpoint:
    """The checkpoint of a training run: model, optimizer (the compiled one by default), the dropout state,
    the micro-batches taken from the data (``DataPosition.batches``), with ``--keep_best_by`` the best dev
    evaluation so far (``training.best.BestState``) and with ``--schedule budget`` the schedule's horizon."""
    parts = {"model": model, "optimizer": optimizer or model.optimizer, SEEDS: dropout_seeds(model)}
    if data_position is not None:
        parts[POSITION] = data_position
    if best is not None:
        parts[BEST] = best
    if horizon is not None:
        parts[HORIZON] = horizon
    return tf.train.Checkpoint(**parts)


def restorable(checkpoint: tf.train.Checkpoint, path: str) -> tf.train.Checkpoint:
    """``checkpoint``, or, where the run now keeps a best dev evaluation (``--keep_best_by``) and the checkpoint
    at ``path`` holds none (the run kept none), the rest of it: the best is tracked from here."""
    if not hasattr(checkpoint, BEST) or holds(path, BEST):
        return checkpoint
    parts = {name: getattr(checkpoint, name) for name in _PARTS if hasattr(checkpoint, name) and name != BEST}
    return tf.train.Checkpoint(**parts)


def holds(path: str, part: str) -> bool:
    """Whether the checkpoint at ``path`` holds ``part`` (e.g. :data:`BEST`)."""
    # The reader of the prefix itself: load_checkpoint would take a prefix that a filesystem lists as a
    # directory (ram:// lists every prefix of a file name) for a directory of checkpoints.
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    return any(key.startswith(f"{part}/") for key in reader.get_variable_to_shape_map())

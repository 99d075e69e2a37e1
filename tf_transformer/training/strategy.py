"""Distribution strategies and precision policies, chosen by name (``auto`` is resolved by :mod:`.options`)."""

from __future__ import annotations

import keras
import tensorflow as tf

from configs.training import PRECISIONS, STRATEGIES


def make_strategy(name: str = "auto") -> tf.distribute.Strategy:
    """``auto``: MirroredStrategy over all GPUs when there are several, else one device.

    ``mirrored`` mirrors over all GPUs, or over all logical CPU devices when
    there is no GPU (how the tests exercise it). ``multi_worker`` reads
    ``TF_CONFIG``; Keras 3 ``fit`` fails under it (keras-team/keras#20585), so the
    trainer drives it with its own loop.

    A worker that dies or stops answering is noticed by the heartbeats of
    TensorFlow's coordination service, which ``MultiWorkerMirroredStrategy``
    starts for chief and worker tasks: the others' collectives are aborted. A
    per-collective ``CommunicationOptions(timeout_seconds=...)`` is not used: TF
    keeps it for debugging, as it starts a thread per collective that lives for
    the whole timeout (docs/distributed.md, "A worker that dies").
    """
    if name == "multi_worker":  # before anything else starts TensorFlow's runtime
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        return tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.OneDeviceStrategy(_first_device())
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(_first_device())
    if name == "mirrored":
        if gpus:
            return tf.distribute.MirroredStrategy()
        cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(cpus, cross_device_ops=tf.distribute.ReductionToOneDevice())
    raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}; got {name!r}")


def _first_device() -> str:
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "/cpu:0"


def set_precision(precision: str) -> None:
    """Sets Keras' global dtype policy (``mixed_float16`` gets loss scaling from ``compile``)."""
    if precision not in PRECISIONS or precision == "auto":
        choices = ", ".join(name for name in PRECISIONS if name != "auto")
        raise ValueError(f"precision must be one of {choices} (auto is resolved first); got {precision!r}")
    keras.config.set_dtype_policy(precision)

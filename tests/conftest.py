"""Test set-up: quiet TensorFlow, split the CPU into logical devices, deterministic seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the kernels tf_transformer picks (see its __init__)

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Two logical CPU devices let the tests exercise MirroredStrategy without a GPU.
# Must run before TensorFlow initializes its devices.
_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
except RuntimeError:  # already initialized (e.g. by a plugin); tests needing 2 devices skip
    pass


# Seed once: re-seeding in eager mode clears TensorFlow's kernel cache, which
# drops resources such as a live SentencepieceTokenizer's model.
keras.utils.set_random_seed(1234)


@pytest.fixture(autouse=True)
def _float32_policy():
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")

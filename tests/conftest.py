"""Test set-up: quiet TensorFlow, the CPU split into logical devices, seeds, and shared fixtures."""

import fcntl
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the kernels tf_transformer picks (see its __init__)

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.commands import export_cli  # noqa: E402
from tests.corpora import tiny_config, tiny_options, write_corpus, write_treebank  # noqa: E402

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


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """A ``train`` split of 300 synthetic pairs."""
    directory = tmp_path_factory.mktemp("corpus")
    write_corpus(directory)
    return directory


@pytest.fixture(scope="session")
def train_corpus_dir(tmp_path_factory):
    """A ``train`` split of 400 synthetic pairs and a ``val`` split of 30."""
    directory = tmp_path_factory.mktemp("train_corpus")
    write_corpus(directory, n=400)
    write_corpus(directory, n=30, seed=5, split="val")
    return directory


def built_once(tmp_path_factory, name: str, build):
    """``build(directory)`` run once for the whole test run, the directory shared by every xdist worker.

    pytest-xdist runs a session per worker, so each worker would train and export a session fixture of its
    own. Under a lock in the run's shared temporary root, the first worker to ask builds it and the others
    reuse it: the fixtures below are read, never changed, by the tests (a test that changes a run copies it).
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps are popen-gw0, popen-gw1, … in one folder
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # what a build that failed left
            build(directory)
            done.touch()
    return directory


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A run directory of the ``tiny`` preset trained for 4 steps (vocabulary of 120 pieces)."""

    def build(root):
        from tf_transformer.training.trainer import train

        write_corpus(root / "corpus", n=300)
        train(tiny_config(), tiny_options(root / "corpus"), str(root / "run"))

    return built_once(tmp_path_factory, "tiny_run", build) / "run"


@pytest.fixture(scope="session")
def tiny_export(tiny_run, tmp_path_factory):
    """``tiny_run`` exported by ``tft-export`` as ``…/tiny_en_de/1`` (output length input + 10).

    Its sources may have 512 tokens, past the run's 64: the tests translate sentences longer than any it
    trained on."""

    def build(root):
        export_cli(tiny_run, root / "tiny_en_de" / "1", "--max_source_length", "512")

    return built_once(tmp_path_factory, "saved_models", build) / "tiny_en_de" / "1"


@pytest.fixture(scope="session")
def tiny_parser(tmp_path_factory):
    """``(run directory, export, treebank directory)`` of the ``tiny`` preset trained a few steps as a parser
    (``--linearization xx``) on a synthetic treebank of three files (it trains on the first two)."""

    def build(root):
        from tf_transformer.training.trainer import train

        write_treebank(root / "mrg", files=3, trees=30)
        options = tiny_options(
            root / "mrg", task="parsing", linearization="xx", train_split="wsj_0001-wsj_0002", dev_split=None
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TFT_TEXT_CACHE", str(root / "text_cache"))  # the split as text, not in the user's cache
            train(tiny_config(beam_size=3, alpha=0.3, max_extra_length=10), options, str(root / "run"))
        export_cli(root / "run", root / "export" / "1")

    root = built_once(tmp_path_factory, "parser", build)
    return root / "run", root / "export" / "1", root / "mrg"

"""Exports load and translate with the op set of the TF Serving users run, and with none of TF Text's.

TF Serving's official builds embed TensorFlow Text 2.12.1. The slow test loads a
fresh export in a second environment holding tensorflow 2.12.1 and
tensorflow-text 2.12.1 (``make serving-venv``) through the session-based loader,
TF Serving's path, as a stand-in for TF Serving's binary, which cannot be
installed here. Every signature of the export is run there, and the export's
warmup file is read as TFRecords by that TensorFlow.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.commands import export_cli
from tf_transformer.exporting.export_info import EXPORT_INFO, REQUEST_TIME_SIGNATURES
from tf_transformer.exporting.warmup_requests import WARMUP_REQUESTS

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVING_PYTHON = ROOT / ".venv-tf212" / "bin" / "python"
CHECK = pathlib.Path(__file__).with_name("session_loader_check.py")
INPUTS = {
    "strings": ["alpha beta gamma", "", "zeta omega", "omega 🙂 sigma", ">>deu<< alpha beta"],
    "ids": [[9, 10, 11, 3], [12, 3, 0, 0]],
    # The request-time signatures' scalars (a target prefix or target is a string of "strings").
    "named": {
        "beam_size": 2,
        "alpha": 1.0,
        "nbest": 2,
        "min_length": 3,
        "max_extra_length": 5,
        "seed": 7,
        "temperature": 0.8,
        "top_k": 20,
        "top_p": 0.9,
    },
}

# Op types of a graph that may be absent from a TensorFlow without tensorflow-text.
CORE_OPS = r"""
import json, sys
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry
model = saved_model_pb2.SavedModel()
with open(sys.argv[1], "rb") as handle:
    model.ParseFromString(handle.read())
ops = set()
for graph in model.meta_graphs:
    ops.update(node.op for node in graph.graph_def.node)
    for function in graph.graph_def.library.function:
        ops.update(node.op for node in function.node_def)
functions = {f.signature.name for g in model.meta_graphs for f in g.graph_def.library.function}
print(json.dumps(sorted(op for op in ops - functions if op_def_registry.get(op) is None)))
"""


def unknown_ops(export) -> list[str]:
    """Op types in ``export``'s graph that a fresh TensorFlow process without tensorflow_text does not know."""
    result = subprocess.run(
        [sys.executable, "-c", CORE_OPS, str(export / "saved_model.pb")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def in_this_tensorflow(export) -> dict:
    """Each signature's outputs for :data:`INPUTS`, loaded by this process's TensorFlow."""
    import tensorflow_text  # noqa: F401

    loaded = tf.saved_model.load(str(export))
    results = {}
    for name, function in loaded.signatures.items():
        feed = {}
        for key, spec in function.structured_input_signature[1].items():
            value = INPUTS["strings"] if spec.dtype == tf.string else INPUTS["ids"]
            feed[key] = tf.constant(INPUTS["named"].get(key, value), spec.dtype)
        outputs = function(**feed)
        results[name] = {key: tensor.numpy() for key, tensor in outputs.items()}
    return results


@pytest.fixture(scope="module")
def ids_only_export(tiny_run, tmp_path_factory):
    return export_cli(tiny_run, tmp_path_factory.mktemp("ids_only") / "tiny_ids" / "1", "--ids_only")


@pytest.mark.slow
def test_ids_only_export_has_only_core_ops_and_translates_like_translate_ids(tiny_export, ids_only_export):
    assert "SentencepieceOp" in unknown_ops(tiny_export)  # the check sees TF Text's ops where they are
    assert unknown_ops(ids_only_export) == []
    info = json.loads((ids_only_export / EXPORT_INFO).read_text())
    assert info["serving_default"] == "translate_ids"
    assert (ids_only_export / "assets" / "sp.model").exists()  # for the client's tokenization
    full, ids_only = in_this_tensorflow(tiny_export), in_this_tensorflow(ids_only_export)
    assert set(ids_only) == {"serving_default", "translate_ids"}
    for name in ids_only:
        np.testing.assert_array_equal(ids_only[name]["ids"], full["translate_ids"]["ids"])
        np.testing.assert_allclose(ids_only[name]["scores"], full["translate_ids"]["scores"], atol=1e-5)


def decoded(value: np.ndarray) -> np.ndarray:
    """A string array's bytes as text, same shape."""
    return np.vectorize(lambda v: v.decode(), otypes=[object])(value)


def serving_build(export, *flags) -> tuple[dict, int | None]:
    """Every signature of ``export`` run by TF 2.12.1 + TF Text 2.12.1's session-based loader, and its warmup
    file's records as that TensorFlow counts them."""
    if not SERVING_PYTHON.exists():
        pytest.skip(f"{SERVING_PYTHON} is missing: build it with `make serving-venv` (downloads about 600 MB)")
    result = subprocess.run(
        [str(SERVING_PYTHON), str(CHECK), str(export), json.dumps(INPUTS), *flags],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["tensorflow"] == "2.12.1"
    return loaded["signatures"], loaded["warmup_records"]


@pytest.fixture(scope="module")
def imported_export(tmp_path_factory):
    """The tiny OPUS-MT reference model (tests/fixtures/marian), made multilingual (language codes such as
    ``>>deu<<``, which the tokenizer takes whole), imported and exported."""
    from tests.importing.marian_layout import write_multilingual_directory
    from tf_transformer.importing.imported_run import import_opus_mt

    source = write_multilingual_directory(tmp_path_factory.mktemp("opus_mt_source") / "opus-mt-en-mul")
    run = import_opus_mt(str(source), str(tmp_path_factory.mktemp("opus_mt") / "run"))
    return export_cli(run, tmp_path_factory.mktemp("opus_mt_export") / "opus_mt" / "1")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["full", "ids_only", "parser", "imported"])
def test_every_signature_runs_in_tf_serving_op_set(kind, tiny_export, ids_only_export, tiny_parser, request):
    exports = {"full": lambda: tiny_export, "ids_only": lambda: ids_only_export, "parser": lambda: tiny_parser[1]}
    exports["imported"] = lambda: request.getfixturevalue("imported_export")
    export = exports[kind]()
    flags = ["--without_tf_text"] if kind == "ids_only" else []
    (there, warmup_records), here = serving_build(export, *flags), in_this_tensorflow(export)
    # The loader ignores assets.extra; the warmup file's framing reads whole with TF 2.12's reader.
    assert warmup_records == sum(1 for _ in tf.data.TFRecordDataset(str(export / WARMUP_REQUESTS))) > 0
    assert set(there) == set(here) and here
    # A fixture change must not shrink the check: the full export's alignment signature is among those run.
    expected = {"serving_default", "translate_ids"}
    if kind != "ids_only":
        expected |= {"translate_with_alignment", *REQUEST_TIME_SIGNATURES}
    assert expected <= set(here), sorted(here)
    for name, outputs in here.items():
        assert set(there[name]) == set(outputs), name
        for key, value in outputs.items():
            if value.dtype == object:
                assert np.array_equal(np.array(there[name][key], dtype=object), decoded(value)), (name, key)
            elif value.dtype.kind == "f":
                np.testing.assert_allclose(there[name][key], value, atol=1e-4, err_msg=f"{name}/{key}")
            else:
                np.testing.assert_array_equal(there[name][key], value, err_msg=f"{name}/{key}")

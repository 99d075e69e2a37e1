"""Exports and run directories written by earlier code still load, resume, export and translate the same.

``tests/fixtures/compat`` was written by ``tests/fixtures/compat/make.sh`` with the
code before the inference package was split out of the layers: a ``tiny`` run
directory (config, vocabulary, a checkpoint of model and optimizer), its export,
and what ``tft-translate`` printed for ``sentences.txt`` from each.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from configs import get_config
from tests.commands import export_cli
from tests.corpora import tiny_options, write_corpus
from tf_transformer import build_transformer
from tf_transformer.decoding.request import DecodeRequest
from tf_transformer.inference.batch_translation import translate_lines, translate_with_checkpoint
from tf_transformer.run_dir import load_run
from tf_transformer.training.averaging import average_checkpoints
from tf_transformer.training.trainer import compile_model, train

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "compat"
SENTENCES = (FIXTURES / "sentences.txt").read_text(encoding="utf-8").split("\n")[:-1]


def expected_rows(name):
    return [line.split("\t") for line in (FIXTURES / name).read_text(encoding="utf-8").split("\n")[:-1]]


def variables(path):
    """``{name: shape}`` of a checkpoint or a SavedModel's variables, without the object graph."""
    return {name: tuple(shape) for name, shape in tf.train.list_variables(str(path)) if "OBJECT_GRAPH" not in name}


def signatures(export):
    """Each signature's inputs and outputs (name, dtype, shape) as the session-based loader sees them."""
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph holds)

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(export))
    return {
        key: {
            side: {name: (info.dtype, str(info.tensor_shape)) for name, info in getattr(signature, side).items()}
            for side in ("inputs", "outputs")
        }
        for key, signature in meta.signature_def.items()
    }


def test_an_old_export_translates_as_it_did():
    got = translate_lines(str(FIXTURES / "export" / "1"), SENTENCES, batch_size=2)
    expected = expected_rows("export_translations.tsv")
    assert [text for text, _ in got] == [text for _, text in expected]
    np.testing.assert_allclose([score for _, score in got], [float(score) for score, _ in expected], atol=1e-3)


def test_an_old_checkpoint_restores_completely_and_translates_as_it_did():
    """Model and optimizer as training builds them today take every value of the old checkpoint."""
    path = str(FIXTURES / "run" / "checkpoints" / "ckpt-4")
    config, _ = load_run(str(FIXTURES / "run"))
    model = compile_model(build_transformer(config), config)
    model.optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(path).assert_consumed()
    reader = tf.train.load_checkpoint(path)
    for index, weight in enumerate(model.trainable_variables[1:], start=1):  # saved in this order
        np.testing.assert_array_equal(
            weight.numpy(), reader.get_tensor(f"optimizer/_trainable_variables/{index}/.ATTRIBUTES/VARIABLE_VALUE")
        )
    got = translate_with_checkpoint(str(FIXTURES / "run"), SENTENCES, 2, DecodeRequest(nbest=2))
    expected = expected_rows("run_translations.tsv")
    assert [text for hyps in got for text, _ in hyps] == [text for _, _, text in expected]
    scores = [score for hyps in got for _, score in hyps]
    np.testing.assert_allclose(scores, [float(score) for _, score, _ in expected], atol=1e-3)


@pytest.mark.slow
def test_an_old_run_exports_the_same_signatures_and_variables(tmp_path):
    old = FIXTURES / "export" / "1"
    new = export_cli(
        FIXTURES / "run", tmp_path / "compat" / "1", "--noalignment", "--norequest_signatures"
    )  # they came later
    assert signatures(new) == signatures(old)
    # The same variables: their order in a SavedModel follows tracing and is not stable from one export to
    # the next, and the feed-forward kernels are stored transposed or not as the exporting CPU decides.
    layout = [tuple(sorted(shape)) for shape in variables(new / "variables" / "variables").values()]
    assert sorted(layout) == sorted(
        tuple(sorted(shape)) for shape in variables(old / "variables" / "variables").values()
    )
    got = translate_lines(str(new), SENTENCES, batch_size=2)
    assert [text for text, _ in got] == [text for _, text in expected_rows("export_translations.tsv")]


@pytest.mark.slow
def test_an_old_run_resumes_and_averages(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "run", run)
    write_corpus(tmp_path / "corpus", n=300)
    stored = json.loads((run / "config.json").read_text())
    stored["run"]["data"] = str(tmp_path / "corpus")  # the corpus at the path the run names (resume checks it)
    (run / "config.json").write_text(json.dumps(stored))
    options = tiny_options(tmp_path / "corpus", train_steps=6)
    summary = train(get_config("tiny"), options, str(run))
    assert summary["steps"] == 6  # resumed at step 4 of the old checkpoint, not from scratch
    assert average_checkpoints(str(run), last=2).endswith("ckpt")

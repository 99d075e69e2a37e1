"""Export for TF Serving: loads in a fresh process with both loaders and translates the same."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from configs import get_config
from pipelines import Tokenizer
from tests.test_pipelines import write_corpus
from tf_transformer.export import export_run
from tf_transformer.training.trainer import RunOptions, restore_model, train
from tf_transformer.translation import translate_lines, translate_with_checkpoint
from tf_transformer.translator import Translator

BIN = pathlib.Path(sys.executable).parent
SENTENCES = [
    "alpha beta gamma",
    "",
    "   ",
    "haus baum katze hund " * 40,  # 160 words: longer than any training example (max_length 64)
    "日本語のテキスト",
    "omega 🙂 sigma",
    "zeta",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("export_run")
    write_corpus(root / "corpus", n=300)
    options = RunOptions(
        data=str(root / "corpus"),
        dev_split=None,
        train_steps=4,
        steps_per_epoch=4,
        checkpoint_every=0,
        tokens=512,
        max_length=64,
        vocab_size=120,
        dev_bleu_sentences=0,
        verbose=0,
    )
    train(get_config("tiny"), options, str(root / "run"))
    return root / "run"


def export_cli(run_dir, output, *flags):
    """``tft-export`` of ``run_dir`` to ``output`` (maximum output length input + 10) in a fresh process."""
    result = subprocess.run(
        [str(BIN / "tft-export"), "--model_dir", str(run_dir), "--output", str(output), "--extra_length", "10", *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    return export_cli(run_dir, tmp_path_factory.mktemp("saved_models") / "tiny_en_de" / "1")


def in_process(run_dir):
    model, config = restore_model(str(run_dir))
    translator = Translator(model, Tokenizer(str(run_dir / "sp.model")), beam_size=4, alpha=0.6, extra_length=10)
    outputs = translator.translate(tf.constant(SENTENCES))
    return [t.decode() for t in outputs["translations"].numpy()], outputs["scores"].numpy()


LOADERS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops
path, sentences = sys.argv[1], json.loads(sys.argv[2])
# (a) TF2 loader
serving = tf.saved_model.load(path).signatures["serving_default"]
out = serving(inputs=tf.constant(sentences))
tf2 = [t.decode() for t in out["translations"].numpy()]
ids = tf.saved_model.load(path).signatures["translate_ids"](inputs=tf.constant([[9, 10, 3]], tf.int32))
# (b) the session-based loader TF Serving uses: tag "serve", feed and fetch by tensor names
with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
    signature = meta.signature_def["serving_default"]
    fetches = {key: value.name for key, value in signature.outputs.items()}
    result = session.run(fetches, {signature.inputs["inputs"].name: sentences})
    v1 = [t.decode() for t in result["translations"]]
scores = out["scores"].numpy().tolist()
print(json.dumps({"tf2": tf2, "v1": v1, "scores": scores, "ids_shape": ids["ids"].shape.as_list()}))
"""


def test_export_layout_and_assets(exported):
    assert exported.name == "1" and exported.parent.name == "tiny_en_de"
    assert (exported / "saved_model.pb").exists() and (exported / "variables").is_dir()
    assert (exported / "assets" / "sp.model").exists()
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_export_saves_each_weight_once(run_dir, exported):
    """The graph's variables only: not the Keras model's copy of them, nor the decoder's unused training layout."""
    model, _ = restore_model(str(run_dir))
    shapes = tf.train.load_checkpoint(str(exported / "variables" / "variables")).get_variable_to_shape_map()
    saved = sum(int(np.prod(shape)) for name, shape in shapes.items() if name != "_CHECKPOINTABLE_OBJECT_GRAPH")
    assert saved == model.count_params()  # the frozen decoding layout holds as many numbers as the kernels


def test_fresh_process_loads_with_both_loaders_and_matches(run_dir, exported):
    expected, expected_scores = in_process(run_dir)
    result = subprocess.run(
        [sys.executable, "-c", LOADERS, str(exported), json.dumps(SENTENCES)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["tf2"] == expected
    assert loaded["v1"] == expected
    np.testing.assert_allclose(loaded["scores"], expected_scores, atol=1e-4)
    assert loaded["ids_shape"][0] == 1
    # Edge cases: empty and whitespace-only in → empty out; the rest produce something, no crash.
    assert expected[1] == "" and expected[2] == ""


def test_bfloat16_export_loads_in_a_fresh_process_and_translates(run_dir, tmp_path):
    """``--dtype bfloat16``: bfloat16 variables in the SavedModel; both loaders run it."""
    output = export_cli(run_dir, tmp_path / "tiny_bf16" / "1", "--dtype", "bfloat16")
    prefix = str(output / "variables" / "variables")
    values = [tf.train.load_variable(prefix, name) for name, _ in tf.train.list_variables(prefix)]
    float_dtypes = {v.dtype.name for v in values if isinstance(v, np.ndarray) and v.dtype.kind in "fV"}
    assert float_dtypes == {"bfloat16"}, float_dtypes
    result = subprocess.run(
        [sys.executable, "-c", LOADERS, str(output), json.dumps(SENTENCES)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["tf2"] == loaded["v1"] and len(loaded["tf2"]) == len(SENTENCES)
    assert loaded["tf2"][1] == "" and all(np.isfinite(loaded["scores"]))


def test_export_with_streams_translates_as_in_process(run_dir, tmp_path):
    """A graph traced with two streams, saved and loaded: the in-process translations (7 sentences: 4 + 3)."""
    output = export_cli(run_dir, tmp_path / "tiny_en_de" / "1", "--streams", "2")
    translated = subprocess.run(
        [str(BIN / "tft-translate"), "--model", str(output), "--scores"]
        + ["--intra_op_threads", "1", "--inter_op_threads", "2"],
        input="\n".join(line.replace("\n", " ") for line in SENTENCES) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert translated.returncode == 0, translated.stderr[-3000:]
    rows = [line.split("\t", 1) for line in translated.stdout.split("\n")[: len(SENTENCES)]]
    texts, scores = in_process(run_dir)
    assert [text for _, text in rows] == texts
    np.testing.assert_allclose([float(score) for score, _ in rows], scores, atol=2e-4)


def test_existing_export_is_not_overwritten(run_dir, exported):
    with pytest.raises(FileExistsError, match="exists"):
        export_run(str(run_dir), str(exported))


def test_translate_cli_keeps_input_order(exported):
    lines = ["zeta", "alpha beta gamma delta epsilon", "", "omega"]
    result = subprocess.run(
        [str(BIN / "tft-translate"), "--model", str(exported), "--batch_size", "2", "--workers", "2"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == 4 and outputs[2] == ""
    assert "translated 4/4" in result.stderr
    single = subprocess.run(  # one sentence, TensorFlow's thread pools set by flag
        [str(BIN / "tft-translate"), "--model", str(exported), "--intra_op_threads", "1", "--inter_op_threads", "2"],
        input="omega\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert single.stdout.split("\n")[0] == outputs[3]


def test_workers_translate_as_one_batch_at_a_time(run_dir, exported):
    """``workers=2``: two batches decoded at once, the same translations in input order (export and checkpoint)."""
    lines = ["zeta", "alpha beta gamma delta", "", "omega sigma", "alpha"]
    one = translate_lines(str(exported), lines, batch_size=2)
    two = translate_lines(str(exported), lines, batch_size=2, workers=2)
    assert [text for text, _ in two] == [text for text, _ in one] and one[2][0] == ""
    np.testing.assert_allclose([score for _, score in two], [score for _, score in one], atol=1e-5)
    single = translate_with_checkpoint(str(run_dir), lines, 2, None, None, 1)
    parallel = translate_with_checkpoint(str(run_dir), lines, 2, None, None, 1, workers=2)
    assert [hyps[0][0] for hyps in parallel] == [hyps[0][0] for hyps in single]
    with pytest.raises(ValueError, match="workers"):
        translate_lines(str(exported), lines, workers=0)


@pytest.mark.parametrize("workers", [1, 3])
def test_batches_come_back_in_input_order_with_progress_and_errors(workers):
    """``_translate_batches`` with a stand-in translator whose batches finish out of order."""
    import random
    import time

    from tf_transformer.translation import _translate_batches

    lines = [f"line {i} " + "x" * random.Random(i).randrange(20) for i in range(23)]

    def reverse(batch):
        time.sleep(random.random() * 0.01)  # batches finish in any order
        return [line[::-1] for line in batch]

    seen = []
    results = _translate_batches(lines, 4, reverse, workers, lambda done, total: seen.append((done, total)))
    assert results == [line[::-1] for line in lines]
    assert [done for done, _ in seen] == [4, 8, 12, 16, 20, 23] and {total for _, total in seen} == {23}
    assert _translate_batches([], 4, reverse, workers, None) == []

    def fail_on_long(batch):
        if any(len(line) > 25 for line in batch):
            raise RuntimeError("batch failed")
        return batch

    with pytest.raises(RuntimeError, match="batch failed"):
        _translate_batches(lines, 4, fail_on_long, workers, None)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port, method, path, body=None, raw=None):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = json.loads(response.read().decode())
    connection.close()
    return response.status, data


def test_serve_speaks_tf_serving_rest_under_concurrency(exported):
    import concurrent.futures
    import time

    port = _free_port()
    server = subprocess.Popen(
        [str(BIN / "tft-serve"), "--model", str(exported.parent), "--port", str(port), "--max_batch_size", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 180
        while True:
            try:
                status, body = _request(port, "GET", "/v1/models/tiny_en_de")
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()[-3000:]
                assert time.time() < deadline, "server did not start"
                time.sleep(0.5)
        assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
        assert body["model_version_status"][0]["version"] == "1"

        sentences = ["zeta", "alpha beta", "omega sigma kappa", ""]
        status, body = _request(port, "POST", "/v1/models/tiny_en_de:predict", {"instances": sentences})
        assert status == 200
        expected = [p["translations"] for p in body["predictions"]]
        assert expected[3] == ""
        status, columnar = _request(port, "POST", "/v1/models/tiny_en_de/versions/1:predict", {"inputs": sentences})
        assert status == 200 and columnar["outputs"]["translations"] == expected

        def client(index):
            answers = []
            for request in range(50):
                pick = (index + request) % len(sentences)
                code, reply = _request(port, "POST", "/v1/models/tiny_en_de:predict", {"instances": [sentences[pick]]})
                answers.append(code == 200 and reply["predictions"][0]["translations"] == expected[pick])
            return answers

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = [ok for answers in pool.map(client, range(8)) for ok in answers]
        assert len(results) == 400 and all(results)

        bad = [
            (None, b"{not json"),
            ({"instances": [1, 2]}, None),
            ({"instances": ["a"] * 9}, None),  # over --max_batch_size
            ({"inputs": ["a"], "instances": ["b"]}, None),
            ({"instances": ["a"], "signature_name": "nope"}, None),
        ]
        for body, raw in bad:
            status, reply = _request(port, "POST", "/v1/models/tiny_en_de:predict", body, raw)
            assert status == 400 and "error" in reply, (body, raw, reply)
        assert _request(port, "GET", "/v1/models/other")[0] == 404
        status, body = _request(port, "POST", "/v1/models/tiny_en_de:predict", {"instances": ["zeta"]})
        assert status == 200 and body["predictions"][0]["translations"] == expected[0]  # still serving
        status, body = _request(
            port, "POST", "/v1/models/tiny_en_de:predict", {"signature_name": "translate_ids", "instances": [[9, 3]]}
        )
        assert status == 200 and isinstance(body["predictions"][0]["ids"], list)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def test_translate_cli_from_a_run_with_nbest(run_dir, exported):
    lines = ["zeta", "alpha beta"]
    result = subprocess.run(
        [str(BIN / "tft-translate"), "--model_dir", str(run_dir), "--beam_size", "3", "--nbest", "2"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("\t") for line in result.stdout.strip("\n").split("\n")]
    assert [r[0] for r in rows] == ["0", "0", "1", "1"]
    assert float(rows[0][1]) >= float(rows[1][1]) and float(rows[2][1]) >= float(rows[3][1])
    streams = subprocess.run(
        [str(BIN / "tft-translate"), "--model_dir", str(run_dir), "--beam_size", "3", "--nbest", "2"]
        + ["--streams", "2", "--intra_op_threads", "1", "--inter_op_threads", "2"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert streams.returncode == 0, streams.stderr[-3000:]
    split_rows = [line.split("\t") for line in streams.stdout.strip("\n").split("\n")]
    assert [(r[0], r[2]) for r in split_rows] == [(r[0], r[2]) for r in rows]  # one sentence per stream: same n-best
    np.testing.assert_allclose([float(r[1]) for r in split_rows], [float(r[1]) for r in rows], atol=2e-4)
    refused = subprocess.run(
        [str(BIN / "tft-translate"), "--model", str(exported), "--nbest", "2"],
        input="zeta\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode != 0 and "--model_dir" in refused.stderr


def test_evaluate_cli_scores_with_sacrebleu(tmp_path, exported):
    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_text("zeta\nalpha beta\nomega\n")
    ref.write_text("Zeta.\nAlpha beta.\nOmega.\n")
    hyp = tmp_path / "out" / "hyp.de"
    result = subprocess.run(
        [str(BIN / "tft-evaluate"), "--model", str(exported), "--src", str(src), "--ref", str(ref)]
        + ["--output", str(hyp)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(scores) >= {"bleu", "chrf", "signature", "sentences", "lc_tok_bleu"}
    assert scores["sentences"] == 3 and "nrefs:1" in scores["signature"] and "case:mixed" in scores["signature"]
    assert len(hyp.read_text().splitlines()) == 3
    ref.write_text("Zeta.\n")
    bad = subprocess.run(
        [str(BIN / "tft-evaluate"), "--model", str(exported), "--src", str(src), "--ref", str(ref)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode != 0 and "test.en has 3 lines" in bad.stderr

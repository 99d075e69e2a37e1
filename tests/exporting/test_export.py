"""Export for TF Serving: loads in a fresh process with both loaders and translates the same."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from pipelines import Tokenizer
from tests.commands import BIN, export_cli
from tests.corpora import WORDS
from tf_transformer.attention_views.maps import attention_maps, hypothesis_length
from tf_transformer.constants import EOS_ID
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.exporting.export_info import EXPORT_INFO, SourceLimit, graph_error, read_export_info
from tf_transformer.exporting.saved_model import export_run
from tf_transformer.inference.translator import Translator
from tf_transformer.run_dir import load_run, restore_model

SENTENCES = [
    "alpha beta gamma",
    "",
    "   ",
    "haus baum katze hund " * 40,  # 160 words: longer than any training example (max_train_length 64)
    "日本語のテキスト",
    "omega 🙂 sigma",
    "zeta",
]


def in_process(tiny_run):
    model, config = restore_model(str(tiny_run))
    options = DecodeOptions(beam_size=4, alpha=0.6, max_extra_length=10)
    translator = Translator(model, Tokenizer(str(tiny_run / "sp.model")), options)
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


def test_export_layout_and_assets(tiny_export):
    assert tiny_export.name == "1" and tiny_export.parent.name == "tiny_en_de"
    assert (tiny_export / "saved_model.pb").exists() and (tiny_export / "variables").is_dir()
    assert (tiny_export / "assets" / "sp.model").exists()
    assert not [p for p in tiny_export.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


def saved_numbers(export) -> int:
    shapes = tf.train.load_checkpoint(str(export / "variables" / "variables")).get_variable_to_shape_map()
    return sum(int(np.prod(shape)) for name, shape in shapes.items() if name != "_CHECKPOINTABLE_OBJECT_GRAPH")


def test_export_saves_each_weight_once(tiny_run, tiny_export, tmp_path):
    """The graph's variables only: not the Keras model's copy of them, nor the decoder's unused training layout.

    The alignment signature's teacher-forced pass reads the decoder's kernels as trained, so with it (the
    default) they are saved a second time, beside their decoding layout, and no more."""
    model, _ = restore_model(str(tiny_run))
    options = DecodeOptions.for_run(str(tiny_run), max_extra_length=10)
    plain = export_run(
        str(tiny_run), str(tmp_path / "plain" / "1"), options, alignment_layer=None, request_signatures=False
    )
    assert saved_numbers(tmp_path / "plain" / "1") == model.count_params()  # the decoding layout: as many numbers
    assert plain.endswith("1")
    decoder_kernels = sum(int(np.prod(w.shape)) for w in model.decoder.weights if w.path.endswith("kernel"))
    assert model.count_params() < saved_numbers(tiny_export) <= model.count_params() + decoder_kernels


@pytest.mark.parametrize("flags, dtype", [({"amx_bf16", "avx512f"}, "bfloat16"), ({"avx2", "avx512f"}, "float32")])
def test_auto_precision_follows_the_cpu_and_is_recorded(tiny_run, tmp_path, monkeypatch, flags, dtype):
    """``--precision auto`` chooses as training does: bfloat16 where the CPU has a bfloat16 unit, with its reason."""
    from tf_transformer import cpu

    monkeypatch.setattr(cpu, "cpu_info", lambda: ("Test CPU", frozenset(flags)))
    output = tmp_path / dtype / "1"
    export_run(str(tiny_run), str(output), dtype="auto", alignment_layer=None, request_signatures=False)
    info = read_export_info(str(output))
    assert info.dtype == dtype
    assert info.precision_reason.startswith("auto: the CPU (Test CPU)")
    assert ("bfloat16 unit" in info.precision_reason) == (dtype == "float32")


def test_alignment_signature_translates_as_serving_default_and_aligns_every_word(tiny_run, tiny_export):
    import tensorflow_text  # noqa: F401

    info = json.loads((tiny_export / EXPORT_INFO).read_text())
    assert info["alignment_layer"] == 1  # tiny has 2 layers: the last
    loaded = tf.saved_model.load(str(tiny_export))
    sentences = tf.constant(["alpha beta gamma", "", "zeta omega sigma kappa"])
    plain = loaded.signatures["serving_default"](inputs=sentences)
    aligned = loaded.signatures["translate_with_alignment"](inputs=sentences)
    assert aligned["translations"].numpy().tolist() == plain["translations"].numpy().tolist()
    np.testing.assert_allclose(aligned["scores"], plain["scores"], atol=1e-5)
    for source, translation, alignment in zip(
        sentences.numpy(), aligned["translations"].numpy(), aligned["alignments"].numpy(), strict=True
    ):
        pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.decode().split()]
        target_words = len(translation.split())
        assert [j for _, j in pairs] == list(range(target_words))  # one pair per target word, in order
        assert all(0 <= i < len(source.split()) for i, _ in pairs)
    attention = aligned["attention"].numpy()  # [batch, out_len, src_len]
    ids = aligned["ids"].numpy()  # [batch, out_len]: the rows' pieces, the translation's own
    assert ids.shape == attention.shape[:2] and not ids[1].any()  # no pieces for ""
    assert np.all(attention[1][:, 0] == 1) and not attention[1][:, 1:].any()  # its source is EOS alone
    processor = spm.SentencePieceProcessor(model_file=str(tiny_export / "assets" / "sp.model"))
    model, _ = restore_model(str(tiny_run))
    for row in (0, 2):
        pieces = [int(i) for i in ids[row] if i > 3]  # no padding or EOS
        assert processor.decode(pieces) == aligned["translations"].numpy()[row].decode()
        # The rows of the translation's tokens are the model's own teacher-forced attention of the export's
        # layer, heads averaged: each sums to 1 over the real source tokens, and padded keys get exactly 0.
        source = [*processor.encode(sentences.numpy()[row].decode()), EOS_ID]
        target = ids[row][: hypothesis_length(ids[row])]
        maps = attention_maps(model, source, target, processor.id_to_piece)
        expected = maps.cross[info["alignment_layer"]].mean(axis=0)  # [target, source]
        np.testing.assert_allclose(attention[row, : len(target), : len(source)], expected, atol=1e-5)
        np.testing.assert_allclose(attention[row, : len(target)].sum(axis=-1), 1.0, atol=1e-5)
        assert not attention[row, :, len(source) :].any()


# Starts a fresh Python process that loads the export with both loaders.
@pytest.mark.slow
def test_fresh_process_loads_with_both_loaders_and_matches(tiny_run, tiny_export):
    expected, expected_scores = in_process(tiny_run)
    result = subprocess.run(
        [sys.executable, "-c", LOADERS, str(tiny_export), json.dumps(SENTENCES)],
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


@pytest.mark.slow
def test_bfloat16_export_loads_in_a_fresh_process_and_translates(tiny_run, tmp_path):
    """``--precision bfloat16``: bfloat16 weights (the norms' γ and β float32); both loaders run it."""
    output = export_cli(
        tiny_run,
        tmp_path / "tiny_bf16" / "1",
        "--precision",
        "bfloat16",
        "--max_source_length",
        "512",
        "--norequest_signatures",
    )
    prefix = str(output / "variables" / "variables")
    values = [tf.train.load_variable(prefix, name) for name, _ in tf.train.list_variables(prefix)]
    floats = [v for v in values if isinstance(v, np.ndarray) and v.dtype.kind in "fV"]
    # Every matrix is bfloat16; the float32 ones are vectors (LayerNormalization keeps γ and β in float32).
    assert {v.dtype.name for v in floats if v.ndim >= 2} == {"bfloat16"}
    float32_shapes = {v.shape for v in floats if v.dtype.name == "float32"}
    assert float32_shapes == {(load_run(str(tiny_run))[0].d_model,)}, float32_shapes
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


@pytest.mark.slow
def test_export_in_batch_parts_translates_as_in_process(tiny_run, tmp_path):
    """A graph traced with two batch parts, saved and loaded: the in-process translations (7 sentences: 4 + 3)."""
    output = export_cli(
        tiny_run,
        tmp_path / "tiny_en_de" / "1",
        "--batch_parts",
        "2",
        "--max_source_length",
        "512",
        "--norequest_signatures",
    )
    assert read_export_info(str(output)).options.batch_parts == 2
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
    texts, scores = in_process(tiny_run)
    assert [text for _, text in rows] == texts
    np.testing.assert_allclose([float(score) for score, _ in rows], scores, atol=2e-4)


def test_existing_export_is_not_overwritten(tiny_run, tiny_export):
    with pytest.raises(FileExistsError, match="exists"):
        export_run(str(tiny_run), str(tiny_export), request_signatures=False)


def sentence_of(tokenizer, tokens: int) -> str:
    """A sentence of the tiny corpus's words that the tokenizer cuts into exactly ``tokens`` pieces."""
    processor, words = tokenizer.python_processor(), []
    while len(processor.encode(" ".join(words))) < tokens:
        fits = [word for word in WORDS if len(processor.encode(" ".join([*words, word]))) <= tokens]
        words.append(fits[len(words) % len(fits)])
    assert len(processor.encode(" ".join(words))) == tokens
    return " ".join(words)


def test_export_refuses_sources_over_its_limit_with_a_clear_error(tiny_run, tmp_path):
    """By default the limit is training's max_train_length (64, EOS included); ids outside the vocabulary fail too."""
    output = export_run(
        str(tiny_run), str(tmp_path / "limited" / "1"), DecodeOptions.for_run(str(tiny_run)), request_signatures=False
    )
    info = json.loads((tmp_path / "limited" / "1" / EXPORT_INFO).read_text())
    assert info["max_source_length"] == 64 and info["source_vocab_size"] == 120
    tokenizer = Tokenizer(str(tiny_run / "sp.model"))
    longest, too_long = sentence_of(tokenizer, 63), sentence_of(tokenizer, 64)  # + EOS: 64 and 65
    signatures = tf.saved_model.load(output).signatures
    assert signatures["serving_default"](inputs=tf.constant([longest, "zeta"]))["translations"].shape == [2]
    with pytest.raises(tf.errors.InvalidArgumentError, match="maximum source length of 64 tokens") as raised:
        signatures["serving_default"](inputs=tf.constant([too_long, "zeta"]))
    assert graph_error(raised.value).startswith("A source sentence is longer than this model's maximum")
    limits = SourceLimit(output)  # what servers and batch tools check before the graph: the same count
    assert limits.limit == 64 and limits.violation(longest) is None and "65 tokens" in limits.violation(too_long)
    with pytest.raises(tf.errors.InvalidArgumentError, match="maximum source length of 64 tokens"):
        signatures["translate_ids"](inputs=tf.constant([[9] * 64 + [3]], tf.int32))
    for bad in ([[9, 120, 3]], [[9, -1, 3]]):
        with pytest.raises(tf.errors.InvalidArgumentError, match="Token ids must"):
            signatures["translate_ids"](inputs=tf.constant(bad, tf.int32))


def test_truncating_export_translates_a_long_source_as_its_first_tokens(tiny_run, tmp_path):
    model, _ = restore_model(str(tiny_run))
    tokenizer = Tokenizer(str(tiny_run / "sp.model"))
    options = DecodeOptions(beam_size=2, max_extra_length=5, max_source_length=8, truncate_source=True)
    translator = Translator(model, tokenizer, options)
    ids = tokenizer.python_processor().encode(sentence_of(tokenizer, 20))
    long, first = tf.constant([ids + [3], ids[:5] + [3] + [0] * 15]), tf.constant([ids[:7] + [3]] * 2)
    cut = translator.translate_ids(long)
    expected = translator.translate_ids(first)  # already within the limit: not changed
    np.testing.assert_array_equal(cut["ids"][0], expected["ids"][0])
    short = translator.translate_ids(tf.constant([ids[:5] + [3]]))  # a short row of the batch is untouched
    np.testing.assert_array_equal(cut["ids"][1, : short["ids"].shape[1]], short["ids"][0])
    with pytest.raises(ValueError, match="needs a max_source_length"):
        DecodeOptions(truncate_source=True)

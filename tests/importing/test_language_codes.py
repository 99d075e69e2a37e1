"""Multilingual OPUS-MT models: a language code such as ``>>deu<<`` at the start of a source is one piece.

Marian's tokenizer in Hugging Face takes ``>>`` up to the first ``<<`` as the code, looks it up in ``vocab.json``
(UNK if absent) and segments the rest with ``source.spm``; the expected ids below follow those steps with the
``sentencepiece`` library, and the slow test in ``test_import_commands.py`` compares with transformers itself.
"""

import json

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from pipelines.vocab import Tokenizer
from tests.importing.marian_layout import LANGUAGE_CODES, write_multilingual_directory
from tf_transformer.constants import EOS_ID, UNK_ID
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.importing.imported_run import import_opus_mt
from tf_transformer.run_dir import restore_model
from tf_transformer.tasks import run_tokenizer

SOURCES = [
    ">>deu<< alpha beta gamma",
    ">>fra<<omega",
    "alpha >>deu<< beta",  # not at the start: text
    ">>xyz<< beta",  # a code the vocabulary lacks: UNK
    ">>deu<<\nhaus baum",
    ">>deu<<",
    "sigma zeta",
]


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    root = tmp_path_factory.mktemp("multilingual")
    source = write_multilingual_directory(root / "opus-mt-en-mul")
    import_opus_mt(str(source), str(root / "run"))
    return source, root / "run"


def hugging_face_ids(source, text):
    """Marian's tokenizer in Hugging Face, step by step: the code, then ``source.spm``'s pieces, as vocab.json's
    ids (a piece it lacks: UNK)."""
    vocab = json.loads((source / "vocab.json").read_text(encoding="utf-8"))
    pieces = []
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        pieces, text = [text[: end + 2]], text[end + 2 :]
    pieces += spm.SentencePieceProcessor(model_file=str(source / "source.spm")).encode(text, out_type=str)
    return [vocab.get(piece, vocab["<unk>"]) for piece in pieces]


def test_a_leading_language_code_is_one_piece_in_the_graph_and_in_python(multilingual):
    source, run = multilingual
    tokenizer = run_tokenizer(str(run))
    assert tokenizer.language_codes
    processor = tokenizer.python_processor()
    vocab = json.loads((source / "vocab.json").read_text(encoding="utf-8"))
    ours = {theirs: processor.piece_to_id(piece) for piece, theirs in vocab.items()}
    ours[vocab["<unk>"]] = UNK_ID
    graph = tokenizer.tokenize(tf.constant(SOURCES)).to_list()
    for text, row in zip(SOURCES, graph, strict=True):
        expected = [ours[i] for i in hugging_face_ids(source, text)]
        assert row == expected, text
        assert tokenizer.encode(text) == expected, text
    codes = [processor.piece_to_id(code) for code in LANGUAGE_CODES]
    assert graph[0][0] == codes[0] and graph[1][0] == codes[1] and graph[3][0] == UNK_ID
    assert graph[5] == [codes[0]]


def test_the_code_chooses_the_output_and_survives_export_and_reload(multilingual, tmp_path):
    """The code's embedding is the model's input: two codes give two encodings (different greedy scores)."""
    _, run = multilingual
    model, _ = restore_model(str(run))
    tokenizer = run_tokenizer(str(run))
    tokens = tokenizer.tokenize(tf.constant([">>deu<< alpha beta", ">>fra<< alpha beta"]))
    inputs = tf.concat([tokens, tf.fill([2, 1], EOS_ID)], axis=1).to_tensor()
    assert inputs[0, 1:].numpy().tolist() == inputs[1, 1:].numpy().tolist() and inputs[0, 0] != inputs[1, 0]
    memory, _ = model.encode(inputs, training=False)
    assert not np.allclose(memory[0].numpy(), memory[1].numpy())
    assert greedy_search(model, inputs, max_output_length=6, min_length=0).shape[0] == 2

    module = tf.Module()
    module.tokenizer = tokenizer
    module.source = tf.function(
        lambda text: tokenizer.tokenize(text).to_tensor(), input_signature=[tf.TensorSpec([None], tf.string)]
    )
    tf.saved_model.save(module, str(tmp_path / "tokenizer"))
    loaded = tf.saved_model.load(str(tmp_path / "tokenizer"))
    padded = tokenizer.tokenize(tf.constant(SOURCES)).to_tensor().numpy()
    np.testing.assert_array_equal(loaded.source(tf.constant(SOURCES)).numpy(), padded)


def test_models_without_codes_read_the_arrows_as_text(tmp_path):
    from tests.importing.test_marian import FIXTURE

    import_opus_mt(str(FIXTURE), str(tmp_path / "run"))
    tokenizer = Tokenizer(str(tmp_path / "run" / "sp.model"))
    assert not tokenizer.language_codes
    text = ">>deu<< alpha"
    assert tokenizer.tokenize(tf.constant([text])).to_list()[0] == tokenizer.encode(text)
    assert len(tokenizer.encode(text)) > 2  # ">>", "deu", "<<" as text pieces, then "alpha"


def test_servers_count_a_code_as_one_token_as_the_graph_does(multilingual, tmp_path):
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.exporting.export_info import SourceLimit
    from tf_transformer.exporting.saved_model import export_run

    _, run = multilingual
    tokenizer = run_tokenizer(str(run))
    text = "  >>deu<< alpha beta gamma"  # the export strips the source first
    tokens = len(tokenizer.encode(text.strip())) + 1  # EOS
    options = DecodeOptions(beam_size=1, max_extra_length=2, max_source_length=tokens)
    output = export_run(str(run), str(tmp_path / "export" / "1"), options, request_signatures=False)
    limits = SourceLimit(output)
    assert limits.tokens(text) == tokens and limits.violation(text) is None
    translate = tf.saved_model.load(output).signatures["serving_default"]
    assert translate(inputs=tf.constant([text]))["translations"].shape == [1]
    longer = text + " delta"
    assert limits.tokens(longer) == tokens + 1 and limits.violation(longer)
    with pytest.raises(tf.errors.InvalidArgumentError, match="maximum source length"):
        translate(inputs=tf.constant([longer]))

    from tf_transformer.attention_views.report import export_attention

    _, (result,) = export_attention(output, [text])  # tft-attention --model: labels as the graph's tokens
    assert result["source_tokens"][0] == ">>deu<<" and len(result["source_tokens"]) == tokens


def test_a_code_before_bytes_that_are_not_utf8_is_kept_as_text(multilingual):
    """The code's regular expressions cannot match such a string whole: it is all text, nothing dropped."""
    _, run = multilingual
    tokenizer = run_tokenizer(str(run))
    raw = tf.constant([b">>deu<< \xff alpha"])
    as_text = tokenizer._known(tokenizer._sp.tokenize(raw)).to_list()
    assert tokenizer.tokenize(raw).to_list() == as_text and len(as_text[0]) > 3


def test_token_caches_of_coded_models_are_not_those_of_before(multilingual, monkeypatch):
    """Caches written before codes were one piece hold the code as text: a multilingual model's key differs."""
    from pipelines.sources import ParallelText
    from pipelines.token_cache import _cache_key

    _, run = multilingual
    tokenizer = run_tokenizer(str(run))
    corpus = ParallelText(source_path=str(run / "config.json"), target_path=str(run / "config.json"))
    with_codes = _cache_key(corpus, tokenizer)
    monkeypatch.setattr(tokenizer, "language_codes", False)
    assert _cache_key(corpus, tokenizer) != with_codes

"""The OPUS-MT import equals Hugging Face's Marian model: tokens, logits and greedy output.

The reference (``tests/fixtures/marian``) is a tiny random ``MarianMTModel`` and what transformers computed with it
(:mod:`tests.importing.marian_reference`); these tests need neither torch nor transformers.
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.importing.imported_run import import_opus_mt
from tf_transformer.run_dir import restore_model
from tf_transformer.tasks import run_tokenizer

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "marian"


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(FIXTURE / "reference.npz"))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """``{timescales: (model, tokenizer, ours)}``: the fixture imported with Marian's position frequencies and with
    Hugging Face's; ``ours[j]`` is our id of Hugging Face's id ``j``, matched by piece."""
    runs = {}
    for timescales in ("tensor2tensor", "paper"):
        run = tmp_path_factory.mktemp(timescales) / "run"
        import_opus_mt(str(FIXTURE), str(run), position_timescales=timescales)
        model, _ = restore_model(str(run))
        tokenizer = run_tokenizer(str(run))
        processor = tokenizer.python_processor()
        by_piece = {processor.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
        vocab = json.loads((FIXTURE / "vocab.json").read_text(encoding="utf-8"))
        ours = np.zeros(len(vocab), np.int64)
        for piece, theirs in vocab.items():
            ours[theirs] = by_piece[piece]
        runs[timescales] = model, tokenizer, ours
    return runs


def _pad_id(reference):
    return int(reference["decoder_input_ids"][0, 0])  # the decoder starts with the pad id in Hugging Face's port


def _ours(ids, ours, pad):
    """Hugging Face's ids as ours (their padding: our 0)."""
    return np.where(ids == pad, PAD_ID, ours[ids]).astype(np.int32)


def test_the_vocabulary_keeps_our_special_ids(imported, reference):
    _, tokenizer, ours = imported["tensor2tensor"]
    assert tokenizer.separate_target
    assert ours[_pad_id(reference)] == PAD_ID and ours[0] == EOS_ID  # vocab.json's </s> is id 0
    assert tokenizer.vocab_size == len(ours) + 1  # one more: BOS, the decoder's first input, a zero row


def test_sources_tokenize_as_hugging_face_s_tokenizer_with_a_missing_piece_as_unk(imported, reference):
    _, tokenizer, ours = imported["tensor2tensor"]
    pad = _pad_id(reference)
    tokens = tokenizer.tokenize(tf.constant(reference["sources"]))  # [batch, (len)], no EOS
    for row, theirs, mask in zip(tokens.to_list(), reference["input_ids"], reference["attention_mask"], strict=True):
        assert row + [EOS_ID] == _ours(theirs[mask == 1], ours, pad).tolist()
    assert tokens.to_list()[-1] == [1]  # the piece vocab.json lacks (``dropped_piece``): UNK, as Marian's lookup does
    targets = tokenizer.tokenize_target(tf.constant(reference["targets"]))
    for row, theirs in zip(targets.to_list(), reference["target_ids"], strict=True):
        assert row + [EOS_ID] == _ours(theirs[theirs != pad], ours, pad).tolist()


@pytest.mark.parametrize("timescales, key", [("tensor2tensor", "logits"), ("paper", "logits_paper")])
def test_logits_equal_hugging_face_s_with_padding(imported, reference, timescales, key):
    model, _, ours = imported[timescales]
    pad = _pad_id(reference)
    sources = _ours(reference["input_ids"], ours, pad)  # [batch, src_len]
    decoder_inputs = _ours(reference["decoder_input_ids"], ours, pad)  # [batch, tgt_len]
    decoder_inputs[:, 0] = BOS_ID  # the start: their pad id (a zero row), our BOS (a zero row)
    logits = model({"inputs": sources, "targets": decoder_inputs}, training=False).numpy()  # [batch, tgt_len, ours]
    theirs = reference[key]  # [batch, tgt_len, vocab]
    real = decoder_inputs != PAD_ID  # padded target positions are no one's output
    entries = np.arange(len(ours)) != pad  # the port's padding entry, which Marian's softmax does not have
    np.testing.assert_allclose(logits[..., ours][real][:, entries], theirs[real][:, entries], atol=1e-4, rtol=0)
    # Padding and BOS are given no probability: every other log-probability is that of Marian's softmax.
    log_probs = tf.nn.log_softmax(logits).numpy()[real]
    assert log_probs[:, [PAD_ID, BOS_ID]].max() < -90
    marian_softmax = theirs[real][:, entries] - np.log(np.exp(theirs[real][:, entries]).sum(-1, keepdims=True))
    np.testing.assert_allclose(log_probs[:, ours[entries]], marian_softmax, atol=1e-4, rtol=0)


def test_greedy_output_equals_hugging_face_s_generate(imported, reference):
    model, _, ours = imported["tensor2tensor"]
    pad = _pad_id(reference)
    sources = _ours(reference["input_ids"], ours, pad)
    length = reference["greedy"].shape[1] - 1  # their start token is not output
    ids = greedy_search(model, tf.constant(sources), max_output_length=length, min_length=0).numpy()
    expected = _ours(reference["greedy"][:, 1:], ours, pad)
    assert ids.shape[1] <= length
    np.testing.assert_array_equal(np.pad(ids, [[0, 0], [0, length - ids.shape[1]]]), expected)


def test_a_saved_model_segments_targets_with_the_target_model(imported, tmp_path):
    """TensorFlow 2's loader gave two SentencePiece ops of one name one model: targets came back segmented by
    the source's (``"alpha"`` is one source piece and five target pieces)."""
    _, tokenizer, _ = imported["tensor2tensor"]
    module = tf.Module()
    module.tokenizer = tokenizer
    spec = [tf.TensorSpec([None], tf.string)]
    module.source = tf.function(lambda text: tokenizer.tokenize(text).to_tensor(), input_signature=spec)
    module.target = tf.function(lambda text: tokenizer.tokenize_target(text).to_tensor(), input_signature=spec)
    tf.saved_model.save(module, str(tmp_path / "tokenizer"))
    loaded = tf.saved_model.load(str(tmp_path / "tokenizer"))
    text = tf.constant(["alpha beta gamma"])
    assert loaded.target(text).numpy().tolist() == tokenizer.tokenize_target(text).to_list()
    assert loaded.source(text).numpy().tolist() == tokenizer.tokenize(text).to_list()
    assert len(tokenizer.tokenize_target(text).to_list()[0]) > len(tokenizer.tokenize(text).to_list()[0])


@pytest.mark.parametrize(
    "change, named",
    [
        ({"normalize_before": True}, "normalize_before"),
        ({"static_position_embeddings": False}, "static_position_embeddings"),
        ({"normalize_embedding": True}, "normalize_embedding"),
        ({"model_type": "bart"}, "model_type"),
        ({"decoder_layers": 3}, "decoder_layers"),
        ({"activation_function": "tanh"}, "activation_function"),
        ({"share_encoder_decoder_embeddings": False}, "separate source and target vocabularies"),
    ],
)
def test_unsupported_models_are_refused_with_the_reason_and_nothing_is_written(tmp_path, change, named):
    from tf_transformer.importing.marian import ModelImportError

    source = tmp_path / "opus"
    source.mkdir()
    for path in FIXTURE.iterdir():
        (source / path.name).write_bytes(path.read_bytes())
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelImportError, match=named):
        import_opus_mt(str(source), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists() and [p.name for p in tmp_path.iterdir()] == ["opus"]


def test_an_existing_run_directory_is_not_replaced(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(FileExistsError, match="--overwrite"):
        import_opus_mt(str(FIXTURE), str(tmp_path / "run"))

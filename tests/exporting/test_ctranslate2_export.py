"""The CTranslate2 export: CTranslate2 computes our model's probabilities, and its greedy search our translations.

Needs the optional ``ctranslate2`` package (``pip install -e '.[reference]'``); without it these tests skip.
"""

import dataclasses
import importlib.util
import json
import shutil

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from configs import TransformerConfig, get_config
from tests.commands import run_command
from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.exporting.ctranslate2 import (
    check_supported,
    export_ctranslate2,
    spec_converter,
    transformer_spec,
    vocabulary_tokens,
)
from tf_transformer.model import build_transformer
from tf_transformer.run_dir import restore_model

needs_ctranslate2 = pytest.mark.skipif(
    importlib.util.find_spec("ctranslate2") is None,
    reason="ctranslate2 is not installed (pip install -e '.[reference]')",
)

FIELDS = {field.name for field in dataclasses.fields(TransformerConfig)}

# Every mapping of the export, each on a model of random weights (biases and LayerNorm parameters included).
VARIANTS = {
    "paper": {},
    "pre_norm": dict(pre_norm=True),
    "learned_positions": dict(position="learned", max_positions=40),
    "attention_bias": dict(attention_bias=True),
    "separate_source_embedding": dict(shared_embeddings=False, source_vocab_size=50),
    "narrow_heads": dict(key_dim=4, value_dim=4),
    "swish": dict(activation="swish"),
    "gelu": dict(activation="gelu"),
    "logits_bias": dict(logits_bias=True),
    "zero_bos_embedding": dict(zero_bos_embedding=True),
    "halves_tensor2tensor": dict(position_layout="halves", position_timescales="tensor2tensor"),
}


def random_model(changes):
    """A ``tiny`` model (vocabulary 64) with ``changes``, every weight drawn at random."""
    missing = sorted(set(changes) - FIELDS)
    if missing:
        pytest.skip(f"TransformerConfig has no {', '.join(missing)} in this version")
    model = build_transformer(get_config("tiny", vocab_size=64, **changes))
    rng = np.random.default_rng(7)
    for weight in model.weights:
        weight.assign(rng.normal(0.0, 0.3, weight.shape).astype(np.float32))
    return model


def tokens(size):
    return ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, size)]


@needs_ctranslate2
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ctranslate2_gives_our_log_probabilities(variant, tmp_path):
    """Teacher-forced log-probabilities of CTranslate2's ``score_batch`` equal ours, on a padded batch."""
    import ctranslate2

    model = random_model(VARIANTS[variant])
    source_names, target_names = tokens(model.source_embedding.vocab_size), tokens(model.target_embedding.vocab_size)
    spec = transformer_spec(ctranslate2, model, source_names, target_names)
    spec_converter(ctranslate2, spec).convert(str(tmp_path / "ct2"))
    sources = [[5, 9, 17, 4, 33], [40], [8, 8, 21, 30, 11, 12, 47, 6, 5]]
    targets = [[6, 7, 8], [12, 13, 14, 15, 16, 17, 18], [60]]

    scored = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu").score_batch(
        [[source_names[i] for i in ids] for ids in sources], [[target_names[i] for i in ids] for ids in targets]
    )

    width = max(map(len, sources)) + 1
    inputs = [ids + [EOS_ID] + [PAD_ID] * (width - len(ids) - 1) for ids in sources]
    length = max(map(len, targets)) + 1
    decoder_inputs = [[BOS_ID] + ids + [PAD_ID] * (length - len(ids) - 1) for ids in targets]
    logits = model({"inputs": tf.constant(inputs), "targets": tf.constant(decoder_inputs)}, training=False)
    log_probs = tf.nn.log_softmax(logits, axis=-1).numpy()  # [batch, length, vocab]
    for row, (ids, result) in enumerate(zip(targets, scored, strict=True)):
        ours = [log_probs[row, step, token] for step, token in enumerate(ids + [EOS_ID])]
        np.testing.assert_allclose(result.log_probs, ours, atol=1e-4, err_msg=variant)


def test_models_ctranslate2_cannot_run_are_refused():
    with pytest.raises(ValueError, match="key_dim 4 and value_dim 8"):
        check_supported(build_transformer(get_config("tiny", key_dim=4, value_dim=8, vocab_size=16)))


def test_vocabulary_names_every_embedding_row():
    pieces = ["<pad>", "<unk>", "<s>", "</s>", "▁a", "▁b"]
    assert vocabulary_tokens(pieces, 8) == pieces + ["<unused_6>", "<unused_7>"]  # rows no id reaches
    assert vocabulary_tokens(pieces, 5) == pieces[:5]  # pieces past the id map: UNK, in CTranslate2 as in ours


@needs_ctranslate2
def test_a_target_sentencepiece_model_goes_with_the_export(tiny_run, tmp_path):
    """A run whose targets have their own SentencePiece model (``sp.target.model``, an imported Marian model's):
    both models are shipped, and the target vocabulary is the target model's pieces."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("data_cache", "logs"))
    shutil.copyfile(run / "sp.model", run / "sp.target.model")
    output = export_ctranslate2(str(run), str(tmp_path / "ct2"))
    names = sorted(path.name for path in (tmp_path / "ct2").iterdir())
    assert {"sp.model", "sp.target.model", "shared_vocabulary.json"} <= set(names)
    vocabulary = json.loads((tmp_path / "ct2" / "shared_vocabulary.json").read_text(encoding="utf-8"))
    processor = spm.SentencePieceProcessor(model_file=str(run / "sp.target.model"))
    assert vocabulary[:5] == [processor.id_to_piece(i) for i in range(5)] and output == str(tmp_path / "ct2")


def ctranslate2_export(run_dir, output, *flags):
    result = run_command(
        "tft-export", "--model_dir", run_dir, "--output", output, "--format", "ctranslate2", *flags, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_ctranslate2
@pytest.mark.slow
def test_ctranslate2_greedy_translations_equal_ours(tiny_run, tmp_path):
    """``tft-export --format ctranslate2`` of the tiny run: CTranslate2's greedy search gives our greedy
    search's pieces, token for token, each sentence with our maximum output length (its source + EOS + 10);
    an int8 export loads and translates."""
    import ctranslate2

    exported = ctranslate2_export(tiny_run, tmp_path / "ct2")
    output = tmp_path / "ct2"
    assert exported["exported"] == str(output)
    names = {path.name for path in output.iterdir()}
    assert {"model.bin", "config.json", "shared_vocabulary.json", "sp.model", "tf_transformer.json"} <= names
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".")]  # no staging left behind

    sentencepiece = spm.SentencePieceProcessor(model_file=str(output / "sp.model"))
    corpus = (tiny_run.parent / "corpus" / "train.en").read_text(encoding="utf-8").splitlines()
    sentences = sorted(corpus[:40], key=len)[::5] + ["zeta", "omega haus baum katze hund " * 6, "unbekannt 🙂"]
    options = DecodeOptions(beam_size=1, alpha=0.0, max_extra_length=10)
    model, _ = restore_model(str(tiny_run))
    translator = ctranslate2.Translator(str(output), device="cpu", compute_type="float32")
    for sentence in sentences:
        ids = sentencepiece.encode(sentence) + [EOS_ID]
        ours = greedy_search(model, tf.constant([ids]), max_extra_length=options.max_extra_length).numpy()[0]
        ours = [sentencepiece.id_to_piece(int(i)) for i in ours if i not in (PAD_ID, EOS_ID)]
        # Our longest output counts EOS and ends with it; CTranslate2's stops after that many tokens, EOS or not.
        (result,) = translator.translate_batch(
            [sentencepiece.encode(sentence, out_type=str)],
            beam_size=1,
            max_decoding_length=options.longest_output(len(ids)) - 1,
            suppress_sequences=[["<pad>"], ["<s>"]],  # the tokens our search never chooses
        )
        assert result.hypotheses[0] == ours, sentence

    quantized = ctranslate2_export(tiny_run, tmp_path / "ct2_int8", "--quantization", "int8")
    assert quantized["quantization"] == "int8"
    int8 = ctranslate2.Translator(quantized["exported"], device="cpu", compute_type="int8")
    results = int8.translate_batch([sentencepiece.encode(s, out_type=str) for s in sentences], beam_size=2)
    assert len(results) == len(sentences) and all(result.hypotheses[0] for result in results)
    assert (output / "model.bin").stat().st_size > (tmp_path / "ct2_int8" / "model.bin").stat().st_size

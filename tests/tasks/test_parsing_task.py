"""Parsing as a task of the toolkit: treebank splits as text, whole-symbol targets, training with dev F1."""

import dataclasses
import json

import pytest
import tensorflow as tf

from tests.corpora import tiny_config, tiny_options, write_treebank
from tf_transformer.tasks import get_task
from tf_transformer.tasks.parsing.linearization import linearize
from tf_transformer.tasks.parsing.task import split_as_text
from tf_transformer.tasks.parsing.treebank import read_range


@pytest.fixture
def text_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TFT_TEXT_CACHE", str(tmp_path / "text_cache"))
    return tmp_path / "text_cache"


def test_a_split_is_written_once_as_words_and_linearized_trees(tmp_path, text_cache):
    write_treebank(tmp_path / "mrg", files=3, trees=5)
    corpus = split_as_text(str(tmp_path / "mrg"), "wsj_0001-wsj_0002", "xx")
    trees = read_range(str(tmp_path / "mrg"), "wsj_0001-wsj_0002")
    pairs = list(corpus.pairs())
    assert len(pairs) == 10 == corpus.num_lines
    assert pairs == [(" ".join(tree.leaves()), " ".join(linearize(tree, "xx"))) for tree in trees]
    stamp = tf.io.gfile.stat(corpus.target_path).mtime_nsec
    again = split_as_text(str(tmp_path / "mrg"), "wsj_0001-wsj_0002", "xx")
    assert again.paths == corpus.paths and tf.io.gfile.stat(again.target_path).mtime_nsec == stamp
    assert split_as_text(str(tmp_path / "mrg"), "wsj_0001-wsj_0002", "tags").paths != corpus.paths


def test_target_symbols_are_whole_pieces_of_the_shared_vocabulary(tmp_path, text_cache):
    task, corpus, tokenizer = _parsing_vocabulary(tmp_path, "xx")
    processor = tokenizer.python_processor()
    source, target = next(iter(corpus.pairs()))
    ids = tokenizer.tokenize_target(tf.constant([target, "(NP XX )NP (UNSEEN"])).to_list()
    assert ids[0] == [processor.piece_to_id(symbol) for symbol in target.split()]
    assert len(ids[0]) == len(target.split()) and 1 not in ids[0]  # one id each, none unknown
    assert ids[1][-1] == 1  # a symbol not in the vocabulary is UNK
    assert tokenizer.detokenize_target(tf.ragged.constant(ids[:1])).numpy()[0].decode() == target
    # The words are SentencePiece text, untouched by the symbols.
    assert tokenizer.tokenize(tf.constant([source])).to_list()[0] == processor.encode(source)


@pytest.mark.slow
def test_a_parsing_run_records_its_task_and_scores_dev_f1(tmp_path, text_cache):
    from tf_transformer.run_dir import load_run
    from tf_transformer.training.trainer import train

    write_treebank(tmp_path / "mrg", files=4, trees=25)
    options = tiny_options(
        tmp_path / "mrg",
        task="parsing",  # no linearization: the default scheme is recorded as used
        train_split="wsj_0001-wsj_0003",
        dev_split="wsj_0004",
        dev_bleu_sentences=10,
        attention_images=1,
        steps_per_epoch=2,
    )
    config = tiny_config(max_extra_length=8, beam_size=3, alpha=0.3, train_steps=2)
    summary = train(config, options, str(tmp_path / "run"))
    assert 0 <= summary["dev_f1"] <= 100 and "dev_bleu" not in summary
    assert summary["history"]["val_f1"] == [summary["dev_f1"]]
    _, run = load_run(str(tmp_path / "run"))
    assert (run["task"], run["linearization"]) == ("parsing", "words")
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    assert set(stored["fingerprints"]["corpus"]) == {"words.words", "words.trees"}


@pytest.mark.slow
def test_a_parsing_run_resumes_with_its_text_rewritten_and_refuses_another_linearization(tmp_path, text_cache):
    import shutil

    from tf_transformer.training.resume import ResumeError
    from tf_transformer.training.trainer import train

    write_treebank(tmp_path / "mrg", files=2, trees=20)
    options = tiny_options(
        tmp_path / "mrg", task="parsing", linearization="xx", train_split="wsj_0001-wsj_0002", dev_split=None
    )
    config = tiny_config(beam_size=3, alpha=0.3, max_extra_length=8)
    train(config.replace(train_steps=2), dataclasses.replace(options, checkpoint_every=2), str(tmp_path / "run"))
    shutil.rmtree(text_cache)  # written again from the trees, byte for byte: the fingerprints still match
    assert train(config, options, str(tmp_path / "run"))["steps"] == 4
    with pytest.raises(ResumeError, match=r"--linearization xx → tags"):
        train(config.replace(train_steps=6), dataclasses.replace(options, linearization="tags"), str(tmp_path / "run"))


@pytest.mark.slow
def test_a_parser_trained_over_allowed_tokens_records_it_and_resumes_only_with_it(tmp_path, text_cache):
    from tf_transformer import run_dir
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.training.options import OptionError
    from tf_transformer.training.resume import ResumeError
    from tf_transformer.training.trainer import train

    write_treebank(tmp_path / "mrg", files=2, trees=20)
    options = tiny_options(
        tmp_path / "mrg", task="parsing", linearization="words", train_split="wsj_0001-wsj_0002", tree_loss="allowed"
    )
    config = tiny_config(beam_size=3, alpha=0.3, max_extra_length=8)
    run = str(tmp_path / "run")
    first = train(config.replace(train_steps=2), dataclasses.replace(options, checkpoint_every=2), run)
    assert run_dir.load_run(run)[1]["tree_loss"] == "allowed"
    assert DecodeOptions.for_run(run).renormalize  # decoded as it trained: a softmax over the allowed tokens
    assert not DecodeOptions.for_run(run, constrained=False).renormalize
    full = train(config.replace(train_steps=2), dataclasses.replace(options, tree_loss="full"), str(tmp_path / "full"))
    assert not DecodeOptions.for_run(str(tmp_path / "full")).renormalize
    assert 0 < first["history"]["loss"][0] < full["history"]["loss"][0]  # same batches: forced tokens cost nothing
    # Accuracy and perplexity are over the same tokens as the loss: a forced token is always right.
    assert first["history"]["token_accuracy"][0] > full["history"]["token_accuracy"][0]
    assert 1 < first["history"]["perplexity"][0] < full["history"]["perplexity"][0]
    with pytest.raises(ResumeError, match=r"--tree_loss allowed → full"):
        train(config, dataclasses.replace(options, tree_loss="full"), run)
    assert train(config, options, run)["steps"] == 4
    with pytest.raises(OptionError, match="--tree_loss is for --task parsing"):
        train(config, tiny_options(tmp_path / "mrg", tree_loss="allowed"), str(tmp_path / "translation"))


@pytest.mark.slow
def test_a_parser_with_bare_closings_learns_them_decodes_trees_and_keeps_them_on_resume(tmp_path, text_cache):
    from tf_transformer import run_dir
    from tf_transformer.decoding.tree_constraint import BARE_CLOSING
    from tf_transformer.tasks import run_tokenizer
    from tf_transformer.training.resume import ResumeError
    from tf_transformer.training.trainer import train

    write_treebank(tmp_path / "mrg", files=2, trees=20)
    options = tiny_options(
        tmp_path / "mrg",
        task="parsing",
        linearization="words",
        train_split="wsj_0001-wsj_0002",
        dev_split="wsj_0002",
        dev_bleu_sentences=5,  # dev F1: decoded under the tree constraint, as trees over the words
        closings="bare",
        checkpoint_every=2,
    )
    config = tiny_config(beam_size=3, alpha=0.3, max_extra_length=8, train_steps=2)
    run = str(tmp_path / "run")
    summary = train(config, options, run)
    assert run_dir.load_run(run)[1]["closings"] == "bare" and summary["dev_f1"] >= 0
    tokenizer = run_tokenizer(run)
    closing = tokenizer.python_processor().piece_to_id(BARE_CLOSING)
    assert closing != 1 and tokenizer.tokenize_target(tf.constant(["(S ) )"])).to_list()[0][1:] == [closing] * 2
    trees = "".join(path.read_text() for path in text_cache.rglob("words.trees"))
    assert " ) " in trees and ")S" not in trees
    with pytest.raises(ResumeError, match=r"--closings bare → labeled"):
        train(config.replace(train_steps=4), dataclasses.replace(options, closings="labeled"), run)
    # Started from its weights, a run with labelled closings would find no piece for them.
    with pytest.raises(ResumeError, match=r"no piece for the target symbol\(s\) .*\)S .*another --linearization"):
        train(config, dataclasses.replace(options, closings="labeled", init_from=run), str(tmp_path / "labeled"))


def test_under_words_targets_mix_whole_symbols_and_word_pieces(tmp_path, text_cache):
    task, corpus, tokenizer = _parsing_vocabulary(tmp_path, "words")
    symbols = task.symbols(corpus)
    assert symbols and all(symbol[0] in "()" for symbol in symbols)  # no word is a symbol
    processor = tokenizer.python_processor()
    _, target = next(iter(corpus.pairs()))
    ids = tokenizer.tokenize_target(tf.constant([target])).to_list()[0]
    expected = [
        piece
        for token in target.split()
        for piece in ([processor.piece_to_id(token)] if token[0] in "()" else processor.encode(token))
    ]
    assert ids == expected
    assert tokenizer.detokenize_target(tf.ragged.constant([ids])).numpy()[0].decode() == target


def _parsing_vocabulary(tmp_path, linearization):
    """``(task, training corpus, tokenizer)`` of a synthetic treebank, the vocabulary trained as a run trains it."""
    from tf_transformer import run_dir

    write_treebank(tmp_path / "mrg", files=2, trees=40)
    task = get_task("parsing", linearization)
    corpus = task.corpus(tiny_options(tmp_path / "mrg", linearization=linearization), "wsj_0001-wsj_0002")
    tokenizer = run_dir.make_vocabulary(
        str(tmp_path / "run"),
        corpus,
        120,
        text=task.vocabulary_text(corpus),
        symbols=task.symbols(corpus),
        symbol_pattern=task.symbol_pattern,
    )
    return task, corpus, tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("tree_loss", ["full", "allowed"])
def test_a_parsing_run_mirrored_over_two_devices_makes_the_one_device_updates(tmp_path, text_cache, tree_loss):
    """The task changes the data, not the layouts: two replicas train a parser to the weights one device does."""
    import numpy as np

    from tests.checkpoints import latest_step, tensors
    from tf_transformer.training.trainer import train

    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (set in conftest before TensorFlow starts)")
    write_treebank(tmp_path / "mrg", files=2, trees=30)
    config = tiny_config(dropout=0.0, beam_size=3, alpha=0.3, max_extra_length=8)  # masks differ per replica
    for strategy in ("one_device", "mirrored"):
        options = tiny_options(
            tmp_path / "mrg",
            task="parsing",
            linearization="words",
            train_split="wsj_0001-wsj_0002",
            dev_split=None,
            strategy=strategy,
            tree_loss=tree_loss,
        )
        assert train(config, options, str(tmp_path / strategy))["steps"] == 4
    one, mirrored = (tensors(tmp_path / name, latest_step(tmp_path / name)) for name in ("one_device", "mirrored"))
    assert sorted(one) == sorted(mirrored)
    for name, value in one.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(mirrored[name], value, rtol=1e-4, atol=1e-5, err_msg=name)

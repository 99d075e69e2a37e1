"""A parser end to end through the commands: tft-parse, tft-evaluate, tft-export, tft-translate and the server.

The model is the ``tiny`` preset trained a few steps on a synthetic treebank: what is checked is that every
command finds the task on its own and gives trees over exactly the input's words, not their accuracy.
"""

import json

import pytest
from nltk import Tree

from tests.commands import run_command
from tf_transformer.tasks.parsing.treebank import read_trees

# Every test here trains or loads a parser run: tens of seconds each, so all run with the slow tests.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def parser(tiny_parser):
    return tiny_parser


@pytest.fixture(scope="module")
def test_set(parser, tmp_path_factory):
    """Words (one sentence per line) and gold trees of the third treebank file."""
    directory = tmp_path_factory.mktemp("parser_test")
    trees = read_trees(str(parser[2] / "wsj_0003.mrg"))
    words = directory / "test.words"
    words.write_text("".join(" ".join(tree.leaves()) + "\n" for tree in trees), encoding="utf-8")
    return words, parser[2] / "wsj_0003.mrg", trees


def test_tft_parse_prints_a_tree_over_every_sentence_s_words(parser, test_set):
    words, _, _ = test_set
    lines = words.read_text().splitlines()[:6]
    result = run_command("tft-parse", "--model", parser[1], "--pretokenized", input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    trees = [Tree.fromstring(line) for line in result.stdout.splitlines()]
    assert [tree.leaves() for tree in trees] == [line.split() for line in lines]
    assert "parsed 6 sentences" in result.stderr


def test_tft_parse_tokenizes_raw_text_as_the_penn_treebank(parser):
    result = run_command("tft-parse", "--model", parser[1], input='He said "I can\'t (yet)."\n')
    assert result.returncode == 0, result.stderr[-3000:]
    words = Tree.fromstring(result.stdout.strip()).leaves()
    assert words == ["He", "said", "``", "I", "ca", "n't", "-LRB-", "yet", "-RRB-", ".", "''"]


def test_tft_parse_refuses_a_translation_model(tiny_export):
    result = run_command("tft-parse", "--model", tiny_export, input="alpha\n")
    assert result.returncode != 0 and "task is translation" in result.stderr


# Two tft-evaluate processes (run and export).
def test_tft_evaluate_scores_a_parser_with_evalb_f1_the_same_from_the_run_and_its_export(parser, test_set, tmp_path):
    words, gold, _ = test_set
    scores = []
    for flag, model in (("--model_dir", parser[0]), ("--model", parser[1])):
        output = tmp_path / f"{flag.strip('-')}.trees"
        result = run_command("tft-evaluate", flag, model, "--src", words, "--ref", gold, "--output", output)
        assert result.returncode == 0, result.stderr[-3000:]
        scores.append(json.loads(result.stdout.strip().splitlines()[-1]))
        assert "F1" in result.stderr and "well-formed before repair" in result.stderr
        trees = [Tree.fromstring(line) for line in output.read_text().splitlines()]
        assert [tree.leaves() for tree in trees] == [line.split() for line in words.read_text().splitlines()]
    assert scores[0] == scores[1]
    own_words = run_command("tft-evaluate", "--model", parser[1], "--ref", gold)  # the gold trees' words parsed
    assert own_words.returncode == 0, own_words.stderr[-3000:]
    assert json.loads(own_words.stdout.strip().splitlines()[-1]) == scores[0]
    assert set(scores[0]) >= {"f1", "precision", "recall", "exact_match", "well_formed", "sentences"}
    assert scores[0]["sentences"] == 30
    refused = run_command("tft-evaluate", "--model", parser[1], "--src", words, "--ref", gold, "--lowercase")
    assert refused.returncode != 0 and "sacreBLEU's" in refused.stderr


def test_tft_evaluate_names_a_sentence_whose_words_differ_from_its_tree(parser, test_set, tmp_path):
    words, gold, _ = test_set
    lines = words.read_text().splitlines()
    lines[4] = "different words"
    changed = tmp_path / "changed.words"
    changed.write_text("\n".join(lines) + "\n")
    result = run_command("tft-evaluate", "--model", parser[1], "--src", changed, "--ref", gold)
    assert result.returncode != 0 and "changed.words:5: the words differ" in result.stderr


def test_the_export_records_its_task_and_the_server_answers_trees(parser, test_set):
    from tf_transformer.exporting.export_info import read_export_info
    from tf_transformer.serving.servable import Servable

    assert read_export_info(str(parser[1])).task == "parsing"
    words = test_set[0].read_text().splitlines()[:3]
    servable = Servable(str(parser[1]), 1)
    outputs = servable.run("serving_default", words)
    assert set(outputs) >= {"translations", "trees", "scores"}
    for line, raw, tree in zip(words, outputs["translations"], outputs["trees"], strict=True):
        assert Tree.fromstring(tree.decode()).leaves() == line.split()
        assert not set(raw.decode().split()) & set(line.split())  # the graph's own output: symbols, no words


def test_tft_translate_on_a_parser_prints_trees(parser, test_set):
    lines = test_set[0].read_text().splitlines()[:2]
    result = run_command("tft-translate", "--model", parser[1], input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [Tree.fromstring(tree).leaves() for tree in result.stdout.splitlines()] == [line.split() for line in lines]


def test_tft_score_gives_the_log_probability_of_gold_trees(parser, test_set):
    """Gold trees are scored as their linearization: the export's figures are the in-process translator's."""
    import numpy as np
    import tensorflow as tf

    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.inference.translator import Translator
    from tf_transformer.run_dir import restore_model
    from tf_transformer.tasks import run_tokenizer, task_of_run

    _, reference, trees = test_set
    result = run_command("tft-score", "--model", parser[1], "--tgt", reference)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [[float(value) for value in line.split("\t")] for line in result.stdout.splitlines()]
    assert len(rows) == len(trees)
    model, config = restore_model(str(parser[0]))
    task = task_of_run(str(parser[0]))
    translator = Translator(model, run_tokenizer(str(parser[0])), DecodeOptions.from_config(config))
    words = tf.constant([" ".join(tree.leaves()) for tree in trees])
    expected = translator.score(words, tf.constant([task.target_text(tree) for tree in trees]))
    np.testing.assert_allclose([row[1] for row in rows], np.asarray(expected["log_probs"]), atol=2e-3)
    symbols = [len(task.target_text(tree).split()) for tree in trees]  # whole symbols and words: at least one piece
    assert all(row[2] >= count + 1 for row, count in zip(rows, symbols, strict=True))  # EOS counted


def test_a_run_directory_parses_constrained_unless_told_and_an_export_fixes_its_own(parser, test_set, tiny_run):
    lines = test_set[0].read_text().splitlines()[:6]
    constrained = run_command("tft-parse", "--model_dir", parser[0], "--pretokenized", input="\n".join(lines) + "\n")
    assert constrained.returncode == 0, constrained.stderr[-3000:]
    assert "parsed 6 sentences; 0 needed a repair" in constrained.stderr
    free = run_command(
        "tft-parse", "--model_dir", parser[0], "--pretokenized", "--noconstrained", input="\n".join(lines) + "\n"
    )
    assert free.returncode == 0, free.stderr[-3000:]
    assert "parsed 6 sentences; 0 needed" not in free.stderr  # a model trained a few steps writes no trees
    assert [Tree.fromstring(line).leaves() for line in free.stdout.splitlines()] == [line.split() for line in lines]
    fixed = run_command("tft-parse", "--model", parser[1], "--noconstrained", input="a\n")
    assert fixed.returncode != 0 and "--constrained is fixed when exporting" in fixed.stderr
    translation = run_command("tft-translate", "--model_dir", tiny_run, "--noconstrained", input="alpha\n")
    assert translation.returncode != 0 and "--constrained is a parser's" in translation.stderr


def test_a_parser_export_takes_raw_text_and_words_split_already(parser):
    """serving_default splits raw text as the Penn Treebank does, in the graph; translate_tokens takes the words
    as they are (tokenized again, ``''`` would become ``````)."""
    from tf_transformer.exporting.export_info import TOKENS_SIGNATURE, read_export_info
    from tf_transformer.serving.servable import Servable
    from tf_transformer.tasks.parsing.penn import penn_tokens

    info = read_export_info(str(parser[1]))
    assert info.options.word_tokenizer == "penn" and TOKENS_SIGNATURE in info.signatures
    servable = Servable(str(parser[1]), 1)
    raw = ['alpha said, "beta (gamma)."', "delta can't."]
    answer = servable.run("serving_default", raw)
    words = [penn_tokens(line).split() for line in raw]
    assert [Tree.fromstring(tree.decode()).leaves() for tree in answer["trees"]] == words
    split = servable.run(TOKENS_SIGNATURE, [" ".join(line) for line in words])
    assert list(split["translations"]) == list(answer["translations"])
    given = servable.run(TOKENS_SIGNATURE, ["alpha '' beta ."])
    assert Tree.fromstring(given["trees"][0].decode()).leaves() == ["alpha", "''", "beta", "."]

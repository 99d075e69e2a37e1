"""The scores of translations: the Moses-tokenized BLEU of the Multi30k papers beside sacreBLEU."""

import math

import pytest

from tests.corpora import SHARED_DATA
from tf_transformer.bleu import moses_tokenized, score

RED = 'Ein Mann fährt ein "rotes" Fahrrad.'
BLUE = 'Ein Mann fährt ein "blaues" Fahrrad.'


def test_moses_bleu_is_bleu4_on_lowercased_moses_tokens_computed_by_hand():
    # ein mann fährt ein &quot; rotes &quot; fahrrad .   against the same with "blaues": 9 tokens each, so no
    # brevity penalty. Matches: unigrams 8/9, bigrams 6/8, trigrams 4/7, 4-grams 2/6.
    assert moses_tokenized([RED], "de") == ["ein mann fährt ein &quot; rotes &quot; fahrrad ."]
    result = score([RED], [BLUE], language="de")
    by_hand = (8 / 9 * 6 / 8 * 4 / 7 * 2 / 6) ** 0.25
    assert result["moses_bleu"] == round(100 * by_hand, 2) == 59.69
    assert result["moses_length_ratio"] == 1.0
    assert result["moses_language"] == "de"


def test_a_short_output_pays_the_brevity_penalty_and_shows_its_length_ratio():
    # 7 tokens against 9: precisions 7/7, 5/6, 4/5, 3/4; brevity penalty exp(1 - 9/7).
    result = score(
        ["Ein Mann fährt ein rotes Fahrrad."], ["Ein Mann fährt ein rotes Fahrrad am Strand."], language="de"
    )
    by_hand = math.exp(1 - 9 / 7) * (5 / 6 * 4 / 5 * 3 / 4) ** 0.25
    assert result["moses_bleu"] == round(100 * by_hand, 2) == 63.19
    assert result["moses_length_ratio"] == round(7 / 9, 3)
    assert result["length_ratio"] == round(7 / 9, 3)  # sacreBLEU's 13a tokens count the same here


def test_moses_normalizes_quotes_that_lowercased_13a_keeps_in_the_word():
    # „rotes“ is one 13a token; Moses' punctuation normalization makes it &quot; rotes &quot; first.
    hypothesis = "Ein Mann fährt ein „rotes“ Fahrrad."
    result = score([hypothesis], [BLUE], language="de")
    assert result["moses_bleu"] == 59.69
    assert result["lc_tok_bleu"] == 36.74  # 13a: 8 tokens, „rotes“ matching nothing
    assert result["moses_bleu"] != result["lc_tok_bleu"]


def test_without_a_language_there_is_no_moses_score():
    result = score([RED], [BLUE])
    assert {"bleu", "length_ratio", "chrf", "lc_tok_bleu"} <= result.keys()
    assert "moses_bleu" not in result


def test_multi30k_references_tokenize_as_the_dataset_published_them():
    path = SHARED_DATA / "multi30k" / "test_2016_flickr.de"
    if not path.exists():
        pytest.skip(f"{path} is missing: see ../shared/data/README.md")
    lines = path.read_text(encoding="utf-8").splitlines()
    tokens = moses_tokenized(lines, "de")
    # data/task1/tok/test_2016_flickr.lc.norm.tok.de of multi30k/dataset: 12,103 tokens (Wu et al.'s reflen).
    assert sum(len(line.split()) for line in tokens) == 12103
    assert tokens[0] == "ein mann mit einem orangefarbenen hut , der etwas anstarrt ."
    assert score(lines, lines, language="de")["moses_bleu"] == 100.0

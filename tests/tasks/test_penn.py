"""Penn Treebank tokenization in the graph (tasks/parsing/penn.py) against nltk's, which tft-parse runs."""

import pytest
import tensorflow as tf

from tests.corpora import SHARED_DATA
from tf_transformer.tasks.parsing.penn import penn_tokenize, penn_tokens

EDGES = [
    'He said "I can\'t (yet)."',
    "I wanna go.\tYou gotta see -- gimme that, 3:15, 1,000 or $5.50?!",
    "'Tis cannot be... [a] {b} <c> x' y 'quote' it's John's; they'll we've I'd I'M DON'T",
    '"Hi," she said, "it\'s 5 o\'clock." Mr. Smith, Jr. left the U.S.',
    "A colon: at the end:",
    "«Unicode» déjà vu — 12½ ’quoted’ and tabs\tand  spaces ",
    "",
    # every kind of space reads as one, and the line is stripped first (a leading tab or an ideographic space
    # before a quote)
    "end.\xa0",
    "wanna\xa0go",
    "What?\u3000Yes.",
    "x\x1cy",
    '\t"Hi there.',
    '\u3000"Hi," he said.\u2003',
]


def in_graph(lines: list[str]) -> list[str]:
    return [text.decode("utf-8") for text in penn_tokenize(tf.constant(lines)).numpy()]


def test_the_graph_tokenizes_as_nltk_does_on_hand_made_cases():
    assert in_graph(EDGES) == [penn_tokens(line) for line in EDGES]
    assert in_graph(['He said "I can\'t (yet)."']) == ["He said `` I ca n't -LRB- yet -RRB- . ''"]


def test_the_graph_tokenizes_the_treebank_sample_s_sentences_as_nltk_does():
    """Every sentence of the WSJ sample, detokenized (nltk's TreebankWordDetokenizer) into the raw text a
    user would send."""
    from nltk.tokenize.treebank import TreebankWordDetokenizer

    from tf_transformer.tasks.parsing.treebank import read_range

    directory = SHARED_DATA / "ptb_sample" / "mrg"
    if not directory.is_dir():
        pytest.skip(f"{directory} is missing: see ../shared/data/README.md")
    detokenize = TreebankWordDetokenizer().detokenize
    lines = [
        detokenize(tree.leaves(), convert_parentheses=True) for tree in read_range(str(directory), "wsj_0001-wsj_0179")
    ]
    assert len(lines) > 3000
    assert in_graph(lines) == [penn_tokens(line) for line in lines]

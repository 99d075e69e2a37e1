"""Trees as whole-token symbol sequences (Vinyals et al. 2015), and the repair of any decoded sequence."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nltk import Tree

from tf_transformer.tasks.parsing.linearization import SCHEMES, linearize, repair, symbol_inventory
from tf_transformer.tasks.parsing.treebank import one_line

TREE = Tree.fromstring("(S (NP (NNP John)) (VP (VBD saw) (NP (DT a) (NN dog))) (. .))")


def test_every_scheme_writes_labelled_brackets():
    assert " ".join(linearize(TREE, "xx")) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"
    assert " ".join(linearize(TREE, "tags")) == "(S (NP (NNP) )NP (VP (VBD) (NP (DT) (NN) )NP )VP (.) )S"
    assert " ".join(linearize(TREE, "words")) == "(S (NP John )NP (VP saw (NP a dog )NP )VP . )S"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_linearized_tree_reads_back_without_repairs(scheme):
    tree, repairs = repair(linearize(TREE, scheme), TREE.leaves(), scheme)
    assert repairs.well_formed
    expected = (
        TREE if scheme == "tags" else Tree.fromstring("(S (NP (XX John)) (VP (XX saw) (NP (XX a) (XX dog))) (XX .))")
    )
    assert tree == expected


@pytest.mark.parametrize("scheme", SCHEMES)
def test_bare_closings_read_back_as_the_labelled_ones_do(scheme):
    bare = linearize(TREE, scheme, "bare")
    assert [symbol for symbol in bare if symbol.startswith(")")] == [")"] * 4
    assert repair(bare, TREE.leaves(), scheme) == repair(linearize(TREE, scheme), TREE.leaves(), scheme)
    assert " ".join(linearize(TREE, "words", "bare")) == "(S (NP John ) (VP saw (NP a dog ) ) . )"
    tree, repairs = repair("(S (NP John ) (VP saw ) a dog . ) )".split(), TREE.leaves(), "words")
    assert one_line(tree) == "(S (NP (XX John)) (VP (XX saw)) (XX a) (XX dog) (XX .))"
    assert (repairs.unmatched_closings, repairs.total) == (1, 1)


def test_under_words_the_output_s_words_are_matched_to_the_input_s_by_content():
    tree, repairs = repair("(S (NP Jon )NP (VP saw (NP a dgo )NP )VP . )S".split(), TREE.leaves(), "words")
    assert tree.leaves() == TREE.leaves() and repairs.replaced_words == 2 and repairs.total == 2
    tree, repairs = repair("(S (NP John )NP (VP saw a dog . extra )VP )S".split(), TREE.leaves(), "words")
    assert repairs.extra_leaves == 1 and repairs.total == 1 and tree.leaves() == TREE.leaves()
    assert repair("(S (NP ▁Jon )NP )S".split(), ["John"], "xx")[1].unknown_symbols == 1


def test_under_words_a_skipped_word_goes_beside_its_neighbour_and_later_words_keep_their_brackets():
    """Matched by position, one skipped word would move every later word one leaf on, and every bracket after
    it would span the wrong words."""
    tree, repairs = repair("(S (NP John )NP (VP (NP a dog )NP )VP . )S".split(), TREE.leaves(), "words")
    assert one_line(tree) == "(S (NP (XX John) (XX saw)) (VP (NP (XX a) (XX dog))) (XX .))"
    assert (repairs.missing_words, repairs.total) == (1, 1)
    tree, repairs = repair("(S (NP )NP (VP saw (NP a dog )NP )VP . )S".split(), TREE.leaves(), "words")
    assert one_line(tree) == "(S (VP (XX John) (XX saw) (NP (XX a) (XX dog))) (XX .))"  # before the first word
    assert (repairs.missing_words, repairs.empty_constituents) == (1, 1)
    tree, repairs = repair("(S (NP John John )NP (VP saw (NP dog )NP )VP . )S".split(), TREE.leaves(), "words")
    assert one_line(tree) == "(S (NP (XX John)) (VP (XX saw) (XX a) (NP (XX dog))) (XX .))"  # after "saw"
    assert (repairs.extra_leaves, repairs.missing_words) == (1, 1)


def test_repairs_are_counted():
    words = ["John", "saw", "a", "dog", "."]
    tree, repairs = repair("(S (NP XX )VP )NP ▁dog (VP XX (NP XX XX XX XX )S".split(), words)
    assert one_line(tree) == "(S (NP (XX John)) (VP (XX saw) (NP (XX a) (XX dog) (XX .))))"
    assert (repairs.unmatched_closings, repairs.unknown_symbols, repairs.extra_leaves, repairs.closed_early) == (
        1,
        1,
        1,
        2,
    )
    assert repairs.total == 5 and not repairs.well_formed

    tree, repairs = repair("(NP XX )NP (VP XX".split(), ["a", "b", "c"])
    assert one_line(tree) == "(S (NP (XX a)) (VP (XX b)) (XX c))"
    assert (repairs.closed_at_end, repairs.missing_words, repairs.added_root) == (1, 1, 1)

    tree, repairs = repair([], ["a", "b"])
    assert one_line(tree) == "(S (XX a) (XX b))" and repairs.missing_words == 2

    tree, repairs = repair("(S (NP )NP XX )S".split(), ["a"])
    assert one_line(tree) == "(S (XX a))" and repairs.empty_constituents == 1


SYMBOLS = st.sampled_from(["(S", ")S", "(NP", ")NP", "(VP", ")VP", "XX", "(DT)", "▁the", "<unk>"])


@settings(max_examples=300, deadline=None)
@given(symbols=st.lists(SYMBOLS, max_size=30), count=st.integers(1, 8))
def test_any_output_repairs_to_a_tree_over_exactly_the_words(symbols, count):
    words = [f"w{index}" for index in range(count)]
    tree, repairs = repair(symbols, words)
    assert tree.leaves() == words
    assert all(len(node) for node in tree.subtrees())  # no empty constituent
    assert all(node.label() for node in tree.subtrees())
    # Well-formed exactly when the output already was this tree's linearization.
    linear = linearize(tree, "tags" if "(DT)" in symbols else "xx")
    assert repairs.well_formed == (symbols == linear and "(DT)" not in symbols or symbols == linear)


def test_the_inventory_is_the_target_vocabulary_most_frequent_first():
    assert symbol_inventory([TREE], "xx") == ["XX", "(NP", ")NP", "(S", "(VP", ")S", ")VP"]


WORD_SYMBOLS = st.sampled_from(["(S", ")S", "(NP", ")NP", "(VP", ")VP", "w0", "w1", "w2", "w3", "other", "XX"])


@settings(max_examples=300, deadline=None)
@given(symbols=st.lists(WORD_SYMBOLS, max_size=30), count=st.integers(0, 6))
def test_any_output_under_words_repairs_to_a_tree_over_exactly_the_words(symbols, count):
    words = [f"w{index}" for index in range(count)]
    tree, repairs = repair(symbols, words, "words")
    assert tree.leaves() == words
    assert all(node.label() for node in tree.subtrees())
    assert all(len(node) for node in tree.subtrees()) or not words
    if repairs.well_formed:
        assert linearize(tree, "words") == symbols

"""The EVALB (COLLINS.prm) scorer on hand-made tree pairs whose answers are worked out by hand."""

import pytest
from nltk import Tree

from tf_transformer.tasks.parsing.evalb import BracketScore, right_branching, score, with_gold_tags

T = Tree.fromstring


def one(gold: str, test: str) -> BracketScore:
    return score([T(gold)], [T(test)])


def test_identical_trees_score_100_and_match_exactly():
    tree = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
    result = one(tree, tree)
    assert (result.precision, result.recall, result.f1, result.exact_match) == (100, 100, 100, 100)
    assert (result.gold, result.test, result.matched) == (3, 3, 3)


def test_punctuation_is_deleted_with_its_word_before_spans_are_compared():
    # The period sits under VP in the test tree, under S in the gold: without it both VPs span word 2 only.
    result = one(
        "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))",
        "(S (NP (DT The) (NN cat)) (VP (VBD sat) (. .)))",
    )
    assert result.f1 == 100
    # A constituent over punctuation only spans no word: it is no bracket.
    result = one("(S (NP (NN Yes)) (PRN (, ,)) (. .))", "(S (NP (NN Yes)) (, ,) (. .))")
    assert (result.gold, result.test, result.f1) == (2, 2, 100)


def test_duplicate_brackets_match_one_to_one():
    gold = "(S (NP (NNS dogs)) (VP (VBP bark)))"
    unary = "(S (NP (NP (NNS dogs))) (VP (VBP bark)))"
    result = one(gold, unary)  # 3 matched of 4 test brackets: the second NP over "dogs" has no partner
    assert (result.matched, result.gold, result.test) == (3, 3, 4)
    assert result.precision == 75 and result.recall == 100
    assert result.f1 == pytest.approx(2 * 75 * 100 / 175)
    assert result.exact_match == 0
    assert one(unary, gold).recall == 75
    assert one(unary, unary).f1 == 100


def test_advp_equals_prt_and_labels_are_cut_at_dash_or_equals():
    result = one(
        "(S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up))))",
        "(S (NP=1 (PRP He)) (VP (VBD gave) (ADVP-TMP (RP up))))",
    )
    assert result.f1 == 100


def test_a_wrong_span_and_a_wrong_label():
    gold = "(S (NP (PRP I)) (VP (VBD saw) (NP (DT the) (NN man))))"  # S[0,4) NP[0,1) VP[1,4) NP[2,4)
    # S[0,4) NP[0,2) VP[2,4) NP[2,4): S and NP[2,4) match; NP[0,2) and VP[2,4) are wrong spans.
    result = one(gold, "(S (NP (PRP I) (VBD saw)) (VP (NP (DT the) (NN man))))")
    assert (result.matched, result.gold, result.test) == (2, 4, 4)
    assert result.f1 == 50
    # PP[2,4) has NP[2,4)'s span but not its label.
    result = one(gold, "(S (NP (PRP I)) (VP (VBD saw) (PP (DT the) (NN man))))")
    assert (result.matched, result.precision, result.recall) == (3, 75, 75)


def test_the_corpus_scores_sum_counts_over_sentences():
    result = score(
        [T("(S (NP (NNS dogs)) (VP (VBP bark)))"), T("(S (NP (PRP I)) (VP (VBD ran)))")],
        [T("(S (NP (NP (NNS dogs))) (VP (VBP bark)))"), T("(S (NP (PRP I) (VBD ran)))")],
    )
    # Sentence 1: 3 of 4 test brackets match 3 gold. Sentence 2: S[0,2) matches; NP[0,2) does not.
    assert (result.matched, result.gold, result.test, result.exact) == (4, 6, 6, 0)
    assert result.precision == pytest.approx(400 / 6)


def test_words_must_be_the_gold_words():
    with pytest.raises(ValueError, match="words differ"):
        one("(S (NN a))", "(S (NN b))")


def test_gold_tags_go_back_on_the_placeholder():
    gold = T("(S (NP (NN Yes)) (. .))")
    test = with_gold_tags(T("(S (NP (XX Yes) (XX .)))"), gold)
    assert test == T("(S (NP (NN Yes) (. .)))")
    assert score([gold], [test]).f1 == 100


def test_the_right_branching_baseline():
    tree = right_branching(["a", "b", "c", "d"], ["DT", "NN", "VBD", "."])
    assert tree == T("(S (DT a) (NP (NN b) (NP (VBD c) (. d))))")
    assert right_branching(["a"]) == T("(S (XX a))")
    assert right_branching(["a", "b"]) == T("(S (XX a) (XX b))")
    assert right_branching(["a", "b", "c"]) == T("(S (XX a) (NP (XX b) (XX c)))")


def test_a_tree_figure_shows_every_word_and_label_once_per_panel():
    from tf_transformer.tasks.parsing.figure import tree_figure

    gold = T("(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))")
    figure = tree_figure([gold, right_branching(gold.leaves())], ["gold", "baseline"])
    panels = figure.axes
    assert [axis.get_title(loc="left") for axis in panels] == ["gold", "baseline"]
    texts = [sorted(text.get_text() for text in axis.texts) for axis in panels]
    assert texts[0] == sorted(["S", "NP", "DT", "NN", "VP", "VBD", ".", "The", "cat", "sat", "."])
    assert texts[1] == sorted(["S", "NP", "NP", "XX", "XX", "XX", "XX", "The", "cat", "sat", "."])


def test_each_tree_deletes_punctuation_by_its_own_tags_as_evalb_does():
    gold = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
    # Tagged otherwise, the period is kept in the test tree only: EVALB's "Length unmatch", an error sentence.
    result = score([T(gold), T(gold)], [T("(S (NP (DT The) (NN cat)) (VP (VBD sat) (NN .)))"), T(gold)])
    assert (result.errors, result.sentences, result.gold, result.test, result.f1) == (1, 1, 3, 3, 100)
    assert result.as_dict()["error_sentences"] == 1
    # A word kept in the gold tree only, though both trees keep as many words: EVALB's "Words unmatch".
    result = one("(S (NP (NN Yes)) (, ,) (NN no))", "(S (NP (NN Yes)) (NN ,) (. no))")
    assert (result.errors, result.sentences) == (1, 0)
    # Another deleted tag deletes the same word: scored, the tag counted wrong.
    result = one(gold, "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (, .))")
    assert (result.errors, result.f1, result.words, result.correct_tags) == (0, 100, 3, 3)
    result = one(gold, "(S (NP (DT The) (JJ cat)) (VP (VBD sat)) (. .))")
    assert (result.words, result.correct_tags) == (3, 2)


def test_a_test_tree_that_keeps_no_word_is_skipped():
    result = one("(S (. .))", "(S (. .))")
    assert (result.skipped, result.sentences, result.exact) == (1, 0, 0)

"""Labelled bracket scores with EVALB's ``COLLINS.prm`` rules (Sekine and Collins, 1997), over every sentence.

The rules, as ``evalb.c`` applies them with ``COLLINS.prm``:

- a preterminal whose tag is deleted (``-NONE-`` and the punctuation tags
  ``,`` ``:`` ```` `` ``''`` ``.``) is removed with its word, so spans count the
  remaining words only; a deleted nonterminal label (``TOP``, ``-NONE-``) removes
  the bracket and keeps what is inside;
- preterminals are not brackets; a bracket left spanning no word is dropped;
- labels are cut at the first ``-`` or ``=`` and ``ADVP`` equals ``PRT``;
- a test bracket matches one gold bracket of the same label and span, one to
  one, so duplicates (unary chains such as ``(S (VP …))`` over one span) count
  as often as they occur in both.

- each tree deletes words by its own tags: where the gold and test trees keep
  different words (a test tree that tags punctuation otherwise: ``--linearization
  tags``), the sentence is an error sentence, counted apart and not scored
  (EVALB's "Length unmatch" and "Words unmatch"); a test tree that keeps no word
  is skipped.

A tree whose words differ from the gold's is refused rather than counted as an
error: a parser's output is a tree over its input words (constrained, or repaired).
"""

from __future__ import annotations

import collections
import dataclasses

from nltk import Tree

from tf_transformer.tasks.parsing.treebank import is_preterminal

DELETED_LABELS = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
EQUAL_LABELS = {"PRT": "ADVP"}


def evalb_label(label: str) -> str:
    """``modify_label`` (cut at the first ``-`` or ``=``) then ``EQ_LABEL ADVP PRT``."""
    for index, char in enumerate(label):
        if char in "-=":
            label = label[:index]
            break
    return EQUAL_LABELS.get(label, label)


def brackets(tree: Tree, kept: list[bool]) -> collections.Counter:
    """``(label, start, end)`` of every scored bracket of ``tree``; ``kept[i]``: word ``i`` is not deleted."""
    found: collections.Counter = collections.Counter()
    position = 0
    index = 0

    def walk(node: Tree) -> None:
        nonlocal position, index
        if is_preterminal(node):
            position += kept[index]
            index += 1
            return
        start = position
        for child in node:
            walk(child)
        label = evalb_label(node.label())
        if position > start and label not in DELETED_LABELS:
            found[(label, start, position)] += 1

    walk(tree)
    return found


def _kept(values: list, kept: list[bool]) -> list:
    return [value for value, keep in zip(values, kept, strict=True) if keep]


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


@dataclasses.dataclass
class BracketScore:
    """Counts over a corpus; precision, recall, F1 and exact match from them (EVALB's "Bracketing" lines)."""

    matched: int = 0
    gold: int = 0
    test: int = 0
    sentences: int = 0
    exact: int = 0
    correct_tags: int = 0
    words: int = 0
    errors: int = 0  # sentences whose trees keep different words (own tags): not scored
    skipped: int = 0  # sentences whose test tree keeps no word: not scored

    @property
    def precision(self) -> float:
        return _percent(self.matched, self.test)

    @property
    def recall(self) -> float:
        return _percent(self.matched, self.gold)

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def exact_match(self) -> float:
        return _percent(self.exact, self.sentences)

    @property
    def tagging_accuracy(self) -> float:
        return _percent(self.correct_tags, self.words)

    def add(self, gold: Tree, test: Tree) -> None:
        """Scores one sentence; ``test`` must be over the same words as ``gold``."""
        words, test_words = gold.leaves(), test.leaves()
        if words != test_words:
            raise ValueError(f"the test tree's words differ from the gold's: {test_words} != {words}")
        gold_tags, test_tags = [tag for _, tag in gold.pos()], [tag for _, tag in test.pos()]
        gold_kept = [tag not in DELETED_LABELS for tag in gold_tags]
        test_kept = [tag not in DELETED_LABELS for tag in test_tags]
        if not any(test_kept):
            self.skipped += 1
            return
        if gold_kept != test_kept and _kept(words, gold_kept) != _kept(words, test_kept):
            self.errors += 1
            return
        gold_brackets, test_brackets = brackets(gold, gold_kept), brackets(test, test_kept)
        matched = sum((gold_brackets & test_brackets).values())
        gold_total, test_total = sum(gold_brackets.values()), sum(test_brackets.values())
        self.matched += matched
        self.gold += gold_total
        self.test += test_total
        self.sentences += 1
        self.exact += gold_total == test_total == matched
        for gold_tag, test_tag in zip(_kept(gold_tags, gold_kept), _kept(test_tags, test_kept), strict=True):
            self.words += 1  # EVALB's tagging accuracy counts the words it keeps
            self.correct_tags += EQUAL_LABELS.get(gold_tag, gold_tag) == EQUAL_LABELS.get(test_tag, test_tag)

    def as_dict(self) -> dict:
        return {
            "f1": round(self.f1, 2),
            "precision": round(self.precision, 2),
            "recall": round(self.recall, 2),
            "exact_match": round(self.exact_match, 2),
            "sentences": self.sentences,
            "error_sentences": self.errors,
            "skipped_sentences": self.skipped,
            "gold_brackets": self.gold,
            "test_brackets": self.test,
            "matched_brackets": self.matched,
        }


def score(gold: list[Tree], test: list[Tree]) -> BracketScore:
    """EVALB's corpus scores of ``test`` against ``gold`` (same length, same words sentence by sentence)."""
    if len(gold) != len(test):
        raise ValueError(f"{len(test)} test trees for {len(gold)} gold trees")
    total = BracketScore()
    for gold_tree, test_tree in zip(gold, test, strict=True):
        total.add(gold_tree, test_tree)
    return total


def with_gold_tags(test: Tree, gold: Tree) -> Tree:
    """``test`` with the gold tree's POS tags on its words (the ``xx`` placeholder's tags put back for scoring)."""
    test = test.copy(deep=True)
    tags = iter(tag for _, tag in gold.pos())
    for position in test.treepositions("leaves"):
        test[position[:-1]].set_label(next(tags))
    return test


def right_branching(words: list[str], tags: list[str] | None = None) -> Tree:
    """The right-branching baseline: ``(S w1 (NP w2 (NP … (NP wn-1 wn))))``.

    Labelling rule: the root is ``S`` (the commonest WSJ root) and every other
    bracket ``NP`` (the commonest label); preterminals take ``tags`` (the gold
    tags, so EVALB deletes the same punctuation) or ``XX``.
    """
    tags = tags or ["XX"] * len(words)
    leaves = [Tree(tag, [word]) for tag, word in zip(tags, words, strict=True)]
    if len(leaves) <= 2:
        return Tree("S", leaves)
    node = Tree("NP", leaves[-2:])
    for leaf in reversed(leaves[1:-2]):
        node = Tree("NP", [leaf, node])
    return Tree("S", [leaves[0], node])

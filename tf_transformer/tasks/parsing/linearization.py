"""A tree as a sequence of whole-token symbols, and any symbol sequence back as a tree over the input words.

Section 6.3 parses as sequence-to-sequence translation (Vinyals et al. 2015,
"Grammar as a Foreign Language"): the source is the sentence's words, the
target the tree written depth-first as brackets. Every constituent ``X`` opens
with the symbol ``(X`` and closes with ``)X`` (a labelled closing, as Vinyals et
al. and tensor2tensor write them), and each word is one symbol for its
preterminal:

- ``xx`` (Vinyals et al.): the placeholder ``XX`` for every word, whatever its
  tag. EVALB ignores preterminals, so the score loses nothing; the model need
  not learn tagging.
- ``tags`` (tensor2tensor's WSJ problem): the word's POS tag, written ``(NNP)``
  so that no tag can be confused with a word or another symbol.
- ``words``: the word itself, as SentencePiece pieces, in place of its
  preterminal. The decoder then reads the words it has written so far, so
  finding the next source word is a copy by content rather than a count of
  placeholders.

``(S (NP (NNP John)) (VP (VBD ran)) (. .))`` is ``(S (NP XX )NP (VP XX )VP XX )S``
under ``xx`` and ``(S (NP John )NP (VP ran )VP . )S`` under ``words``. With bare
closings (``--closings bare``) every constituent closes with ``)``: ``(S (NP John ) (VP
ran ) . )``; a closing's label says nothing a tree needs, but it tells the
decoder which constituent it has just closed. Whatever
the scheme, a parse's words are the source's, put back in order by
:func:`repair`: under ``words`` the output's own words only count leaves.

Bracket and preterminal symbols match :data:`SYMBOL_PATTERN`: the vocabulary
holds each whole (:class:`pipelines.Tokenizer`'s ``symbol_pattern``); a word
(``words``) is text for SentencePiece. Penn Treebank words never start with a
bracket (``-LRB-``), so none is taken for a symbol; a word spelled ``XX`` would be.

A decoded sequence need not be a tree. :func:`repair` makes it one over
exactly the input words and counts each repair: a closing whose label is
open elsewhere closes what lies between (a bare one the innermost), a closing of nothing open is
dropped, a preterminal beyond the last word is dropped, missing words are
attached to the top constituent, brackets still open at the end are closed,
several top constituents (or none) are put under one ``S``.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import re

from nltk import Tree

from configs.decoding import TREE_LINEARIZATIONS
from configs.training import CLOSINGS as RUN_CLOSINGS
from tf_transformer.tasks.parsing.treebank import is_preterminal

SCHEMES = TREE_LINEARIZATIONS
DEFAULT_SCHEME = "words"  # chosen on dev: docs/parsing.md#trees-as-sequences
CLOSINGS = RUN_CLOSINGS
DEFAULT_CLOSINGS = "labeled"  # docs/design/parsing.md#training-as-it-decodes
BARE_CLOSING = ")"
PLACEHOLDER = "XX"
SYMBOL_PATTERN = r"[()]\S+|XX"  # (NP )NP (NNP) XX: the symbols of every scheme
BARE_SYMBOL_PATTERN = r"[()]\S+|\)|XX"  # and the bare closing ) (its own, so labelled runs keep their caches)
TOP_LABEL = "S"  # the label given to a root the repair has to add (the commonest sentence root in WSJ)


def leaf_symbol(tag: str, word: str, scheme: str) -> str:
    return {"xx": PLACEHOLDER, "tags": f"({tag})", "words": word}[scheme]


def linearize(tree: Tree, scheme: str = "xx", closings: str = DEFAULT_CLOSINGS) -> list[str]:
    """The target symbols of ``tree`` (see the module)."""
    if scheme not in SCHEMES:
        raise ValueError(f"linearization must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    if closings not in CLOSINGS:
        raise ValueError(f"closings must be one of {', '.join(CLOSINGS)}, got {closings!r}")
    symbols: list[str] = []

    def walk(node: Tree) -> None:
        if is_preterminal(node):
            symbols.append(leaf_symbol(node.label(), node[0], scheme))
            return
        symbols.append(f"({node.label()}")
        for child in node:
            walk(child)
        symbols.append(f"){node.label()}" if closings == DEFAULT_CLOSINGS else BARE_CLOSING)

    walk(tree)
    return symbols


def symbol_kind(symbol: str) -> tuple[str, str]:
    """``("open", "NP")``, ``("close", "NP" or "" for a bare closing)``, ``("leaf", "NNP" or "XX")`` or
    ``("other", symbol)`` (a word)."""
    if symbol == PLACEHOLDER:
        return "leaf", PLACEHOLDER
    if symbol == BARE_CLOSING:
        return "close", ""
    if len(symbol) > 2 and symbol[0] == "(" and symbol[-1] == ")":
        return "leaf", symbol[1:-1]
    if len(symbol) > 1 and symbol[0] == "(":
        return "open", symbol[1:]
    if len(symbol) > 1 and symbol[0] == ")":
        return "close", symbol[1:]
    return "other", symbol


@dataclasses.dataclass
class Repairs:
    """What :func:`repair` changed in one output (all zero: the output was a well-formed tree over the words)."""

    unknown_symbols: int = 0  # not a bracket or preterminal symbol (a word piece, UNK): dropped
    unmatched_closings: int = 0  # a closing of a label not open: dropped
    closed_early: int = 0  # constituents a closing of a label further out closed
    empty_constituents: int = 0  # closed with no word inside: dropped
    extra_leaves: int = 0  # preterminals beyond the last input word (words: output words no input word pairs): dropped
    missing_words: int = 0  # input words no preterminal took: beside their neighbour (words), else at the top
    replaced_words: int = 0  # words: an output word that differs from the input word it stands for
    closed_at_end: int = 0  # constituents still open when the output ended
    added_root: int = 0  # several top constituents, or none: put under one S

    @property
    def total(self) -> int:
        return sum(dataclasses.asdict(self).values())

    @property
    def well_formed(self) -> bool:
        return self.total == 0

    def add(self, other: Repairs) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def repair(symbols: list[str], words: list[str], scheme: str = "xx") -> tuple[Tree, Repairs]:
    """A tree over exactly ``words`` from decoded ``symbols``, and the repairs it took (see the module).

    Under ``xx`` and ``tags`` preterminals take ``words`` in order (tagged ``XX``
    but under ``tags``). Under ``words`` every token that is no symbol is a
    word, and the output's words are matched to the input's by content
    (:func:`_match_words`): a skipped word is put back beside its neighbour
    rather than shifting every later word one leaf on.
    """
    leaf_tag = PLACEHOLDER
    repairs = Repairs()
    stack: list[Tree] = [Tree("", [])]  # a virtual root collects the top constituents
    leaves: list[Tree] = []  # under ``words``: the output's word leaves, in order
    used = 0

    def close() -> None:
        node = stack.pop()
        if len(node):
            stack[-1].append(node)
        else:
            repairs.empty_constituents += 1

    for symbol in symbols:
        kind, label = symbol_kind(symbol)
        if kind == "open":
            stack.append(Tree(label, []))
        elif kind == "close":
            open_ = range(len(stack) - 1, 0, -1)  # a bare closing closes the innermost
            depth = next((i for i in open_ if not label or stack[i].label() == label), None)
            if depth is None:
                repairs.unmatched_closings += 1
                continue
            repairs.closed_early += len(stack) - 1 - depth
            while len(stack) > depth:
                close()
        elif scheme == "words" and kind == "other":
            leaves.append(Tree(leaf_tag, [symbol]))
            stack[-1].append(leaves[-1])
        elif kind == "leaf" and scheme != "words":
            if used == len(words):
                repairs.extra_leaves += 1
                continue
            stack[-1].append(Tree(leaf_tag if label == PLACEHOLDER else label, [words[used]]))
            used += 1
        else:
            repairs.unknown_symbols += 1
    repairs.closed_at_end = len(stack) - 1
    while len(stack) > 1:
        close()
    root = stack[0]
    if leaves:
        root, used = _put_words(root, _match_words(leaves, words, repairs), repairs), len(words)
    if used < len(words):
        repairs.missing_words = len(words) - used
        target = root[-1] if len(root) == 1 and not is_preterminal(root[-1]) else root
        target.extend(Tree(leaf_tag, [word]) for word in words[used:])
    if len(root) == 1 and not is_preterminal(root[0]):
        return root[0], repairs
    repairs.added_root = 1
    return Tree(TOP_LABEL, list(root)), repairs


def _match_words(leaves: list[Tree], words: list[str], repairs: Repairs) -> dict[int, list[str]]:
    """The input words each output word leaf stands for (by ``id``), matched in order by content.

    Equal runs match (difflib's longest matching blocks); where output and
    input differ, their words pair up in order (each pair counted as a replaced
    word), an output word left over is dropped (an extra leaf) and an input
    word left over goes with the leaf of the input word before it, or the
    first leaf for words before any (a missing word).
    """
    owner: list[int | None] = [None] * len(words)  # the leaf each input word goes with
    matcher = difflib.SequenceMatcher(None, [leaf[0] for leaf in leaves], words, autojunk=False)
    for operation, i1, i2, j1, j2 in matcher.get_opcodes():
        paired = min(i2 - i1, j2 - j1)
        owner[j1 : j1 + paired] = range(i1, i1 + paired)
        repairs.replaced_words += paired if operation == "replace" else 0
        repairs.extra_leaves += (i2 - i1) - paired
    repairs.missing_words += owner.count(None)
    taken: dict[int, list[str]] = {id(leaf): [] for leaf in leaves}
    if not words:
        return taken
    first = next(index for index in owner if index is not None)  # with leaves and words, some pair
    previous = None
    for index, word in zip(owner, words, strict=True):
        previous = index if index is not None else previous
        taken[id(leaves[first if previous is None else previous])].append(word)
    return taken


def _put_words(root: Tree, taken: dict[int, list[str]], repairs: Repairs) -> Tree:
    """``root`` with each word leaf replaced by the preterminals of its words (none: dropped)."""

    def rebuild(node: Tree) -> list[Tree]:
        if id(node) in taken:
            return [Tree(PLACEHOLDER, [word]) for word in taken[id(node)]]
        children = [kept for child in node for kept in rebuild(child)]
        if not children and node is not root:
            repairs.empty_constituents += 1
            return []
        return [Tree(node.label(), children)]

    return rebuild(root)[0]


def symbol_pattern(closings: str) -> str:
    """The pattern of the target symbols under ``closings`` (:data:`SYMBOL_PATTERN`, :data:`BARE_SYMBOL_PATTERN`)."""
    return SYMBOL_PATTERN if closings == DEFAULT_CLOSINGS else BARE_SYMBOL_PATTERN


def symbol_inventory(trees, scheme: str) -> list[str]:
    """Every target symbol of ``trees`` (words not), most frequent first (ties by name): the target vocabulary."""
    counts = collections.Counter(
        symbol for tree in trees for symbol in linearize(tree, scheme) if re.fullmatch(SYMBOL_PATTERN, symbol)
    )
    return sorted(counts, key=lambda symbol: (-counts[symbol], symbol))

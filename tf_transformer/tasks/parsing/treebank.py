"""Penn Treebank trees read and cleaned for parsing (section 6.3: WSJ, as in Vinyals et al. 2015).

The ``.mrg`` files are read here (nltk's corpus readers refuse paths outside
``NLTK_DATA``) and each tree is parsed with ``nltk.Tree.fromstring``. Cleaning
follows the usual WSJ parsing setup, so that what is trained on and scored is
the syntactic bracketing only:

- the outer unlabelled root ``( (S …) )`` goes: it would count as one more bracket;
- ``-NONE-`` empty elements go, and every constituent left without words;
- function tags and indices go: ``NP-SBJ-1`` and ``NP=2`` become ``NP`` (cut at
  the first ``-`` or ``=``, as EVALB cuts labels); labels that begin with ``-``
  (``-LRB-``, ``-RRB-``, ``-NONE-``) are whole labels.

A file that does not read as trees stops with an error naming the file, the
tree's number and its line.
"""

from __future__ import annotations

import dataclasses
import os
import re

from nltk import Tree

from pipelines.text_lines import DataError

EMPTY_ELEMENT = "-NONE-"


def strip_label(label: str) -> str:
    """``NP-SBJ-1`` → ``NP``, ``NP=2`` → ``NP``; ``-LRB-``, ``-NONE-`` stay whole."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0]


def is_preterminal(node) -> bool:
    return isinstance(node, Tree) and len(node) == 1 and isinstance(node[0], str)


def clean(tree: Tree) -> Tree | None:
    """``tree`` without empty elements, empty constituents and function tags; ``None`` if no word is left."""
    if is_preterminal(tree):
        return None if tree.label() == EMPTY_ELEMENT else Tree(tree.label(), [tree[0]])
    children = [child for child in (clean(node) for node in tree if isinstance(node, Tree)) if child is not None]
    if not children:
        return None
    return Tree(strip_label(tree.label()), children)


def without_root(tree: Tree) -> Tree:
    """The tree under an unlabelled root ``( (S …) )``; a tree with a labelled root is returned as it is."""
    while tree.label() == "" and len(tree) == 1 and isinstance(tree[0], Tree):
        tree = tree[0]
    return tree


def split_trees(text: str, name: str) -> list[tuple[int, str]]:
    """The top-level bracketed trees of a ``.mrg`` file's text, each with the line it starts on."""
    trees, depth, start, line, start_line = [], 0, 0, 1, 1
    for index, char in enumerate(text):
        if char == "\n":
            line += 1
        elif char == "(":
            if depth == 0:
                start, start_line = index, line
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise DataError(f"{name}:{line}: tree {len(trees) + 1}: a ')' closes nothing")
            if depth == 0:
                trees.append((start_line, text[start : index + 1]))
        elif depth == 0 and not char.isspace():
            raise DataError(f"{name}:{line}: text outside a tree: {text[index : index + 30]!r}")
    if depth:
        raise DataError(f"{name}:{start_line}: tree {len(trees) + 1}: {depth} bracket(s) never closed")
    return trees


def parse_tree(text: str, name: str, number: int, line: int) -> Tree:
    """One bracketed tree, cleaned (see the module); errors name the file, tree number and line."""
    where = f"{name}:{line}: tree {number}"
    try:
        tree = Tree.fromstring(text)
    except ValueError as error:
        raise DataError(f"{where}: not a bracketed tree ({error})") from None
    if isinstance(tree, str) or not len(tree):
        raise DataError(f"{where}: an empty tree")
    for node in tree.subtrees():
        words = [child for child in node if isinstance(child, str)]
        if words and len(node) > 1:
            raise DataError(f"{where}: the word {words[0]!r} is not under a preterminal")
    cleaned = clean(without_root(tree))
    if cleaned is None:
        raise DataError(f"{where}: no words left once empty elements are removed")
    if cleaned.label() == "" or any(node.label() == "" for node in cleaned.subtrees()):
        raise DataError(f"{where}: a constituent without a label")
    return cleaned


def read_trees(path: str) -> list[Tree]:
    """Every tree of one ``.mrg`` file, cleaned, in file order."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start})") from None
    return [parse_tree(tree, path, number, line) for number, (line, tree) in enumerate(split_trees(text, path), 1)]


@dataclasses.dataclass(frozen=True)
class FileRange:
    """Treebank files by name: ``wsj_0001-wsj_0159``, or several ranges and names joined by ``,``.

    A range takes every file whose name without extension sorts between its
    two ends, both included (WSJ names sort by section and number).
    """

    spec: str

    def parts(self) -> list[tuple[str, str]]:
        parts = []
        for part in self.spec.split(","):
            first, _, last = part.strip().partition("-")
            if not first:
                raise DataError(f"file range {self.spec!r}: an empty part")
            parts.append((first, last or first))
        return parts

    def select(self, directory: str) -> list[str]:
        """The paths of ``directory``'s files in this range, sorted; an error if there are none."""
        if not os.path.isdir(directory):
            raise DataError(f"treebank directory not found: {directory}")
        names = sorted(name for name in os.listdir(directory) if not name.startswith("."))
        chosen = [
            os.path.join(directory, name)
            for name in names
            if any(first <= os.path.splitext(name)[0] <= last for first, last in self.parts())
        ]
        if not chosen:
            raise DataError(f"no treebank files {self.spec!r} in {directory}")
        return chosen


def read_range(directory: str, spec: str) -> list[Tree]:
    """The cleaned trees of the files ``spec`` (a :class:`FileRange`) in ``directory``, in file order."""
    return [tree for path in FileRange(spec).select(directory) for tree in read_trees(path)]


def one_line(tree: Tree) -> str:
    """``(S (NP (NNP John)) (VP (VBD ran)))``: a tree on one line."""
    return tree.pformat(margin=1 << 30)

"""Checks ``tf_transformer.tasks.parsing.evalb.score`` against the real EVALB (``evalb.c``, ``COLLINS.prm``).

EVALB is not part of this project: build it elsewhere from its public source
(``gcc -o evalb evalb.c``) and pass the binary and its ``COLLINS.prm``.

    .venv/bin/python tools/compare_evalb.py --evalb /path/to/evalb --prm /path/to/COLLINS.prm \\
        --treebank /work/shared/data/ptb_sample/mrg --files wsj_0160-wsj_0179

The gold trees are the cleaned treebank trees of ``--files``. Test sets are
built from them, each keeping every gold word and, but one set, every tag:
gold itself, the right-branching baseline, seeded perturbations (relabelling,
``ADVP``/``PRT`` swaps, deleted constituents, same-label unary wrappers, moved
final punctuation, function tags such as ``NP-SBJ-1`` and ``NP=2``, and all of
them at once), trees whose tags were replaced by ``XX`` and put back with
``with_gold_tags``, and retagged trees (``retag``, as ``--linearization tags``
predicts tags: punctuation tagged as a word is an error sentence, since both
delete words by each tree's own tags; at most eight of them).

Both files hold one tree per line as ``(TOP …)``; ``COLLINS.prm`` deletes
``TOP``. For every set the script checks that EVALB's corpus counts, P/R/F1,
complete match and tagging accuracy (to its two printed decimals), its
numbers of valid, error and skipped sentences and every sentence's
matched/gold/test counts equal the scorer's; that EVALB gives the same counts
for bare trees without a root; and that the scorer gives the same counts for ``TOP``-wrapped
trees. It also shows what an unlabelled root ``( …)`` adds in EVALB. Exits 1
on any disagreement.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import subprocess
import sys
import tempfile

from nltk import Tree

from tf_transformer.tasks.parsing.evalb import BracketScore, right_branching, score, with_gold_tags
from tf_transformer.tasks.parsing.treebank import is_preterminal, one_line, read_range

# EVALB's fixed limits (evalb.c): beyond them it misreads a line without saying so.
MAX_LINE_CHARS = 4998  # fgets(buff, 5000) must take the line and its newline
MAX_WORDS = 200
MAX_BRACKETS = 200

LABELS = ["NP", "VP", "S", "PP", "SBAR", "ADJP", "ADVP", "PRT", "QP", "WHNP"]
SWAPS = {"NP": ["PRT", "ADVP"], "PRT": ["NP", "ADVP"], "ADVP": ["NP", "PRT"]}
FUNCTION_TAGS = ["-SBJ", "-SBJ-1", "=2", "-TMP", "-LOC-3", "-PRD=1", "-CLR"]
ROOTS = {"TOP": "(TOP {})", "bare": "{}", "unlabelled": "( {})"}


def rebuild(tree, leaf=lambda node: [node], inner=lambda node, children: [Tree(node.label(), children)]):
    """``tree`` rebuilt bottom-up; each function returns the list of nodes that replace a node."""
    if is_preterminal(tree):
        return leaf(tree)
    return inner(tree, [new for child in tree for new in rebuild(child, leaf, inner)])


def relabel(tree: Tree, rng: random.Random, rate: float = 0.2) -> Tree:
    def inner(node, children):
        label = node.label()
        if rng.random() < rate:
            label = rng.choice(SWAPS.get(label) or LABELS)
        return [Tree(label, children)]

    return rebuild(tree, inner=inner)[0]


def swap_advp_prt(tree: Tree, rng: random.Random) -> Tree:
    """Every ``ADVP`` becomes ``PRT`` and back (``EQ_LABEL ADVP PRT``: nothing changes)."""
    swap = {"ADVP": "PRT", "PRT": "ADVP"}
    return rebuild(tree, inner=lambda node, children: [Tree(swap.get(node.label(), node.label()), children)])[0]


def delete(tree: Tree, rng: random.Random, rate: float = 0.2) -> Tree:
    """Some constituents below the root spliced into their parent."""

    def inner(node, children):
        return children if node is not tree and rng.random() < rate else [Tree(node.label(), children)]

    return rebuild(tree, inner=inner)[0]


def unary(tree: Tree, rng: random.Random, rate: float = 0.15) -> Tree:
    """Some nodes (preterminals too) wrapped in a node of the same label: ``(NP (NP …))``, ``(. (. .))``."""

    def wrap(node):
        return [Tree(node.label(), [node]) if rng.random() < rate else node]

    return rebuild(tree, leaf=wrap, inner=lambda node, children: wrap(Tree(node.label(), children)))[0]


def move_final_punctuation(tree: Tree, rng: random.Random) -> Tree:
    """The root's final punctuation preterminals moved into the constituent before them, at a random depth."""
    tree = tree.copy(deep=True)
    moved = []
    while len(tree) > 1 and is_preterminal(tree[-1]) and not tree[-1].label()[0].isalpha():
        moved.insert(0, tree.pop())
    target = tree[-1]
    if not moved or is_preterminal(target):
        tree.extend(moved)
        return tree
    while not is_preterminal(target[-1]) and rng.random() < 0.5:
        target = target[-1]
    target.extend(moved)
    return tree


def function_tags(tree: Tree, rng: random.Random, rate: float = 0.3) -> Tree:
    def inner(node, children):
        label = node.label() + (rng.choice(FUNCTION_TAGS) if rng.random() < rate else "")
        return [Tree(label, children)]

    return rebuild(tree, inner=inner)[0]


PUNCTUATION_TAGS = [",", ":", "``", "''", "."]  # COLLINS.prm's deleted tags


def retag(tree: Tree, rng: random.Random, rate: float = 0.1) -> Tree:
    """Some tags changed (as ``--linearization tags`` predicts them): punctuation tagged as a word (the test
    tree keeps a word the gold deletes: an error sentence) or as other punctuation, a word tagged otherwise."""

    def leaf(node):
        tag = node.label()
        if rng.random() >= rate:
            return [node]
        if tag in PUNCTUATION_TAGS:
            tag = rng.choice(["NN", *[other for other in PUNCTUATION_TAGS if other != tag]])
        else:
            tag = rng.choice(["NN", "JJ", "VB", "RB"])
        return [Tree(tag, list(node))]

    return rebuild(tree, leaf=leaf)[0]


def mixed(tree: Tree, rng: random.Random) -> Tree:
    for change in (relabel, delete, unary, move_final_punctuation, function_tags):
        tree = change(tree, rng)
    return tree


def with_xx_tags(tree: Tree) -> Tree:
    return with_gold_tags(tree, Tree("X", [Tree("XX", [word]) for word in tree.leaves()]))


def baseline(tree: Tree, gold_tags: bool) -> Tree:
    """``right_branching`` over ``tree``'s words, with its tags or ``XX``."""
    return right_branching(tree.leaves(), [tag for _, tag in tree.pos()] if gold_tags else None)


def build_test_sets(gold: list[Tree], seed: int) -> dict[str, list[Tree]]:
    rng = random.Random(seed)
    sets = {"gold": [tree.copy(deep=True) for tree in gold]}
    sets["right-branching"] = [baseline(tree, True) for tree in gold]
    for change in (relabel, swap_advp_prt, delete, unary, move_final_punctuation, function_tags, mixed):
        sets[change.__name__.replace("_", "-")] = [change(tree, rng) for tree in gold]
    sets["gold, XX put back"] = [with_gold_tags(with_xx_tags(tree), tree) for tree in gold]
    sets["mixed, XX put back"] = [with_gold_tags(with_xx_tags(tree), tree) for tree in sets["mixed"]]
    sets["right-branching, XX put back"] = [with_gold_tags(baseline(tree, False), tree) for tree in gold]
    sets["retag"] = retagged(gold, rng)
    for name, trees in sets.items():
        for gold_tree, test_tree in zip(gold, trees, strict=True):
            if name != "retag" and gold_tree.pos() != test_tree.pos():
                raise AssertionError(f"{name}: a test tree changed the gold words or tags")
    return sets


def retagged(gold: list[Tree], rng: random.Random, errors: int = 8) -> list[Tree]:
    """:func:`retag` of every tree, keeping at most ``errors`` error sentences (COLLINS.prm's ``MAX_ERROR 10``
    stops EVALB at the eleventh)."""
    test, left = [], errors
    for tree in gold:
        changed = retag(tree, rng)
        result = score([tree], [changed])
        if result.errors:
            if not left:
                changed = tree.copy(deep=True)
            left -= bool(left)
        test.append(changed)
    return test


@dataclasses.dataclass
class EvalbResult:
    summary: dict[str, str]  # the "-- All --" lines, values as printed
    totals: tuple[int, int, int]  # matched, gold, test brackets (the line under the table)
    sentences: list[tuple[int, int, int]]  # per sentence: matched, gold, test
    stderr: str


def run_evalb(evalb: str, prm: str, gold_lines: list[str], test_lines: list[str], directory: str) -> EvalbResult:
    paths = []
    for name, lines in (("gold", gold_lines), ("test", test_lines)):
        for line in lines:
            if len(line) > MAX_LINE_CHARS:
                raise ValueError(f"a {name} line has {len(line)} characters, more than EVALB reads")
        paths.append(os.path.join(directory, f"{name}.txt"))
        with open(paths[-1], "w", encoding="utf-8") as handle:
            handle.writelines(line + "\n" for line in lines)
    done = subprocess.run([evalb, "-p", prm, *paths], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"EVALB failed ({done.returncode}): {done.stderr}")
    table, summary = done.stdout.split("=== Summary ===")
    _, rows, totals = table.split("=" * 76)
    sentences = [tuple(int(field) for field in row.split()[5:8]) for row in rows.strip().splitlines()]
    all_section = summary.split("-- len<=")[0]
    values = dict(re.findall(r"^(\S.*?)\s*=\s*(\S+)$", all_section, flags=re.MULTILINE))
    return EvalbResult(values, tuple(int(field) for field in totals.split()[2:5]), sentences, done.stderr)


def counts(result: BracketScore) -> tuple[int, int, int]:
    return result.matched, result.gold, result.test


def check_limits(tree: Tree) -> None:
    brackets = sum(1 for node in tree.subtrees() if not is_preterminal(node))
    if len(tree.leaves()) > MAX_WORDS or brackets > MAX_BRACKETS:
        raise ValueError(f"a tree has more words or brackets than EVALB holds: {one_line(tree)[:80]}")


def compare(name: str, gold: list[Tree], test: list[Tree], args, directory: str) -> tuple[list[str], list[str]]:
    """One table row, and the disagreements (empty if none)."""
    for tree in test:
        check_limits(Tree("TOP", [tree]))
    ours = score(gold, test)
    runs = {
        root: run_evalb(
            args.evalb,
            args.prm,
            [pattern.format(one_line(tree)) for tree in gold],
            [pattern.format(one_line(tree)) for tree in test],
            directory,
        )
        for root, pattern in ROOTS.items()
    }
    evalb = runs["TOP"]
    s, evalb_counts = evalb.summary, evalb.totals
    problems = []
    unmatched = re.findall(r"^\d+ : (?:Length|Words) unmatch", evalb.stderr, flags=re.MULTILINE)
    if len(unmatched) != ours.errors or len(evalb.stderr.strip().splitlines()) != ours.errors:
        problems.append(f"EVALB's errors ({ours.errors} error sentences here): {evalb.stderr.strip()}")
    expected = {
        "Number of Valid sentence": str(ours.sentences),
        "Number of Error sentence": str(ours.errors),
        "Number of Skip  sentence": str(ours.skipped),
        "Bracketing Precision": f"{ours.precision:.2f}",
        "Bracketing Recall": f"{ours.recall:.2f}",
        "Bracketing FMeasure": f"{ours.f1:.2f}",
        "Complete match": f"{ours.exact_match:.2f}",
        "Tagging accuracy": f"{ours.tagging_accuracy:.2f}",
    }
    for key, value in expected.items():
        if s.get(key) != value:
            problems.append(f"{key}: EVALB {s.get(key)}, ours {value}")
    if evalb_counts != counts(ours):
        problems.append(f"matched/gold/test: EVALB {evalb_counts}, ours {counts(ours)}")
    per_sentence = [counts(score([g], [t])) for g, t in zip(gold, test, strict=True)]
    differing = [i + 1 for i, (a, b) in enumerate(zip(evalb.sentences, per_sentence, strict=True)) if a != b]
    if differing:
        problems.append(f"per-sentence counts differ on lines {differing[:10]}")
    if runs["bare"].sentences != evalb.sentences:
        problems.append("EVALB's counts on bare trees differ from those on (TOP …) trees")
    wrapped = score([Tree("TOP", [t]) for t in gold], [Tree("TOP", [t]) for t in test])
    if counts(wrapped) != counts(ours) or wrapped.exact != ours.exact:
        problems.append(f"ours on (TOP …) trees: {counts(wrapped)}, unwrapped {counts(ours)}")
    extra = "/".join(str(a - b) for a, b in zip(runs["unlabelled"].totals, evalb_counts, strict=True))
    row = [
        name,
        "/".join(map(str, evalb_counts)),
        "/".join(map(str, counts(ours))),
        f"{s['Bracketing Precision']} {s['Bracketing Recall']} {s['Bracketing FMeasure']}",
        f"{ours.precision:.2f} {ours.recall:.2f} {ours.f1:.2f}",
        f"{s['Complete match']} / {ours.exact_match:.2f}",
        s["Number of Valid sentence"],
        extra,
        "yes" if not problems else "NO",
    ]
    return row, [f"{name}: {problem}" for problem in problems]


HEADER = [
    "test set",
    "EVALB m/g/t",
    "ours m/g/t",
    "EVALB P R F1",
    "ours P R F1",
    "exact EVALB/ours",
    "valid",
    "( …) adds",
    "agree",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evalb", required=True, help="the EVALB binary")
    parser.add_argument("--prm", required=True, help="EVALB's COLLINS.prm")
    parser.add_argument("--treebank", required=True, help="the directory of .mrg files")
    parser.add_argument("--files", default="wsj_0160-wsj_0179", help="the gold files (a treebank file range)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the perturbations")
    parser.add_argument("--workdir", help="keep EVALB's input files here (default: a temporary directory)")
    args = parser.parse_args(argv)

    gold = read_range(args.treebank, args.files)
    for tree in gold:
        check_limits(Tree("TOP", [tree]))
    rows, problems = [], []
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.workdir or scratch
        os.makedirs(directory, exist_ok=True)
        for name, test in build_test_sets(gold, args.seed).items():
            row, found = compare(name, gold, test, args, directory)
            rows.append(row)
            problems.extend(found)
    print(f"{len(gold)} gold trees from {args.files}; (TOP …) on both sides; seed {args.seed}\n")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("\n".join(problems) if problems else "EVALB and the scorer agree on every test set and sentence.")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

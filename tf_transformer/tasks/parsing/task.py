"""Parsing as a task (section 6.3): treebank files in, words → linearized trees, EVALB F1 on dev.

``--data`` is a directory of ``.mrg`` files and a split is a file range
(:class:`~tf_transformer.tasks.parsing.treebank.FileRange`): the WSJ sample's
``wsj_0001-wsj_0159`` trains and ``wsj_0160-wsj_0179`` is dev. A split's trees
are written once as two line-aligned text files, the words and the
linearized trees (:mod:`~tf_transformer.tasks.parsing.linearization`), under
``$TFT_TEXT_CACHE`` in a folder named by a hash of the files' bytes and the
linearization: from there the data pipeline, its cache and the run's
fingerprints treat them as any parallel text.

The source vocabulary is SentencePiece trained on the words only; the target
symbols are added to it as user-defined pieces, one id each, and targets are
tokenized by splitting on spaces (whole tokens, never split into pieces). The
model keeps one shared vocabulary (section 3.4).
"""

from __future__ import annotations

import collections
import hashlib
import os
import re

import pipelines
from configs.decoding import PARSING_DECODING
from pipelines.sources import text_cache_dir
from pipelines.text_lines import DataError, read_lines
from tf_transformer.files import write_bytes
from tf_transformer.tasks.base import Splits, Task
from tf_transformer.tasks.parsing import evalb, treebank
from tf_transformer.tasks.parsing.linearization import (
    CLOSINGS,
    DEFAULT_CLOSINGS,
    DEFAULT_SCHEME,
    PLACEHOLDER,
    SCHEMES,
    Repairs,
    linearize,
    repair,
    symbol_pattern,
)
from tf_transformer.tasks.parsing.penn import penn_tokens

FORMAT_VERSION = 1  # of the text files written from the trees


class Parsing(Task):
    """WSJ constituency parsing, scored with EVALB's rules (``evalb.py``)."""

    name = "parsing"
    metric = "f1"
    splits = Splits("wsj_0001-wsj_0159", "wsj_0160-wsj_0179")
    decoding = PARSING_DECODING  # section 6.3's beam 21, α 0.3 and input + 300
    word_tokenizer = "penn"  # an export takes raw English text (penn.penn_tokenize)
    tree_loss = "full"  # docs/design/parsing.md#training-as-it-decodes

    def __init__(self, linearization: str | None = None, closings: str | None = None):
        self.linearization = linearization or DEFAULT_SCHEME
        if self.linearization not in SCHEMES:
            raise ValueError(f"--linearization must be one of {', '.join(SCHEMES)}, got {self.linearization!r}")
        self.closings = closings or DEFAULT_CLOSINGS
        if self.closings not in CLOSINGS:
            raise ValueError(f"--closings must be one of {', '.join(CLOSINGS)}, got {self.closings!r}")
        self.symbol_pattern = symbol_pattern(self.closings)
        self.tree = self.linearization  # decoded as well-formed trees of it (constraint.TreeConstraint)

    def corpus(self, options, split: str) -> pipelines.ParallelText:
        return split_as_text(options.data, split, self.linearization, self.closings)

    def symbols(self, corpus) -> list[str]:
        counts = collections.Counter(
            token
            for line in read_lines(corpus.target_path)
            for token in line.split()
            if re.fullmatch(self.symbol_pattern, token)  # words (--linearization words) are SentencePiece text
        )
        return sorted(counts, key=lambda symbol: (-counts[symbol], symbol))

    def vocabulary_text(self, corpus):
        return ((source, "") for source, _ in corpus.pairs())  # the words (also those of targets under ``words``)

    def dev_set(self, options, limit: int):
        trees = treebank.read_range(options.data, options.dev_split)[:limit]
        return [" ".join(tree.leaves()) for tree in trees], trees

    def read_test_set(self, source_path: str | None, reference_path: str):
        """Sentences, one per line, their words separated by spaces; gold trees in a ``.mrg`` file, in order.

        Without ``source_path`` the sentences are the gold trees' words.
        """
        references = treebank.read_trees(reference_path)
        if source_path is None:
            return [" ".join(tree.leaves()) for tree in references], references
        sources = list(read_lines(source_path))
        if len(sources) != len(references):
            raise DataError(f"{source_path} has {len(sources)} lines but {reference_path} {len(references)} trees")
        for number, (source, tree) in enumerate(zip(sources, references, strict=True), start=1):
            if source.split() != tree.leaves():
                raise DataError(
                    f"{source_path}:{number}: the words differ from those of tree {number} of {reference_path} "
                    f"({' '.join(tree.leaves())[:80]!r})"
                )
        return sources, references

    def target_text(self, reference) -> str:
        return " ".join(linearize(reference, self.linearization, self.closings))

    def summary(self, result: dict) -> str:
        unscored = result.get("error_sentences", 0) + result.get("skipped_sentences", 0)
        return (
            f"F1 {result['f1']:.2f}  precision {result['precision']:.2f}  recall {result['recall']:.2f}  "
            f"exact match {result['exact_match']:.2f}  well-formed before repair {result['well_formed']:.2f} %"
            + (f"  error or skipped sentences (EVALB's) {unscored}" if unscored else "")
        )

    def postprocess(self, source: str, output: str, word_tokenizer: str | None = None) -> str:
        words = penn_tokens(source) if word_tokenizer == "penn" else source
        return treebank.one_line(repair(output.split(), words.split(), self.linearization)[0])

    def score(self, sources: list[str], outputs: list[str], references: list, **options) -> dict:
        if options:
            raise ValueError(f"parsing is scored with EVALB's rules only: {', '.join(options)} do not apply")
        return score_outputs(sources, outputs, references, self.linearization)


def score_outputs(sources: list[str], outputs: list[str], references: list, scheme: str = "xx") -> dict:
    """EVALB scores of decoded symbol sequences against gold trees, after repair; repairs counted.

    Placeholder preterminals take the gold tags for scoring (EVALB deletes
    punctuation by tag; ``evalb.py``), predicted tags are scored as they are.
    """
    if not len(sources) == len(outputs) == len(references):
        raise ValueError(f"{len(sources)} sources, {len(outputs)} outputs, {len(references)} references")
    total, repairs, well_formed = evalb.BracketScore(), Repairs(), 0
    for source, output, gold in zip(sources, outputs, references, strict=True):
        tree, repaired = repair(output.split(), source.split(), scheme)
        repairs.add(repaired)
        well_formed += repaired.well_formed
        if any(tag == PLACEHOLDER for _, tag in tree.pos()):
            tree = evalb.with_gold_tags(tree, gold)
        total.add(gold, tree)
    return {
        **total.as_dict(),
        "well_formed": round(100.0 * well_formed / max(1, len(outputs)), 2),
        "repairs": {name: value for name, value in vars(repairs).items() if value},
    }


def split_as_text(directory: str, spec: str, scheme: str, closings: str = DEFAULT_CLOSINGS) -> pipelines.ParallelText:
    """The trees of ``spec`` as ``words``/``trees`` text files (see the module), written once, atomically."""
    if scheme not in SCHEMES:
        raise ValueError(f"--linearization must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    paths = treebank.FileRange(spec).select(directory)
    variant = scheme if closings == DEFAULT_CLOSINGS else f"{scheme}|{closings}"  # labelled: the folders of before
    digest = hashlib.sha256(f"v{FORMAT_VERSION}|{variant}|{spec}".encode())
    for path in paths:
        with open(path, "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    folder = os.path.join(text_cache_dir(), f"treebank__{digest.hexdigest()[:16]}")
    words, trees = os.path.join(folder, f"{scheme}.words"), os.path.join(folder, f"{scheme}.trees")
    if not (os.path.exists(words) and os.path.exists(trees)):
        read = [tree for path in paths for tree in treebank.read_trees(path)]
        os.makedirs(folder, exist_ok=True)
        write_bytes(words, "".join(" ".join(tree.leaves()) + "\n" for tree in read).encode("utf-8"))
        lines = (" ".join(linearize(tree, scheme, closings)) + "\n" for tree in read)
        write_bytes(trees, "".join(lines).encode("utf-8"))
    return pipelines.parallel_files(words, trees)

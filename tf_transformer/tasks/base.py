"""A task of the toolkit: what differs between translation (section 6.1) and parsing (section 6.3).

The model, the training recipe and every layout, the decoding cache and the
export are one for all tasks. A task names only what is its own:

- its data: the pairs of source and target text a split of ``--data`` gives
  (:meth:`Task.corpus`), and the dev sources and references scored during
  training (:meth:`Task.dev_set`);
- how a target is written as tokens: SentencePiece pieces, or whole symbols
  that SentencePiece never splits (:attr:`Task.symbol_pattern`,
  :meth:`Task.symbols`);
- how an output is read back (:meth:`Task.postprocess`) and scored
  (:meth:`Task.score`, whose :attr:`Task.metric` is logged each epoch);
- its decoding defaults (:attr:`Task.decoding`).

The run directory records its task (``config.json``'s ``run.task``), so the
commands after training need no task flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Splits:
    """The ``--train_split`` and ``--dev_split`` a task uses when none are given."""

    train: str
    dev: str


class Task:
    """The translation task's behaviour is the default; :mod:`~tf_transformer.tasks.parsing` overrides."""

    name: str = ""
    metric: str = ""  # the dev score's name in logs and TensorBoard ("bleu", "f1")
    splits: Splits = Splits("train", "val")
    symbol_pattern: str | None = None  # target tokens held whole (pipelines.Tokenizer); None: targets are text
    decoding: dict = {}  # TransformerConfig fields the task decodes with (beam_size, alpha, max_extra_length)
    tree: str | None = None  # a parser's linearization: its outputs are kept to well-formed trees (DecodeOptions)
    word_tokenizer: str | None = None  # how an export splits raw source text into words (DecodeOptions)
    tree_loss: str | None = None  # a parser's default loss (configs.training.TREE_LOSSES)

    @property
    def target_symbols(self) -> bool:
        return self.symbol_pattern is not None

    def tokenizer(self, path: str):
        """The in-graph tokenizer of the SentencePiece model at ``path`` for this task's targets."""
        import pipelines

        return pipelines.Tokenizer(path, symbol_pattern=self.symbol_pattern)

    def corpus(self, options, split: str):
        """The ``(source, target)`` text of ``split`` as a validated :class:`pipelines.ParallelText`."""
        raise NotImplementedError

    def symbols(self, corpus) -> Sequence[str]:
        """Target symbols the vocabulary must hold whole (none for translation)."""
        return ()

    def vocabulary_text(self, corpus) -> Iterable[tuple[str, str]]:
        """The pairs whose text trains the SentencePiece model (both sides, or only the source)."""
        return corpus.pairs()

    def dev_set(self, options, limit: int) -> tuple[list[str], list]:
        """Up to ``limit`` dev sources and the references :meth:`score` compares with."""
        raise NotImplementedError

    def read_test_set(self, source_path: str, reference_path: str) -> tuple[list[str], list]:
        """Sources and references of a test set (``tft-evaluate --src --ref``), validated, errors naming lines."""
        raise NotImplementedError

    def target_text(self, reference) -> str:
        """A reference of :meth:`read_test_set` as the target text the model reads and writes (for scoring)."""
        return reference

    def summary(self, result: dict) -> str:
        """One line of :meth:`score`'s result for people."""
        return f"{self.metric} {result[self.metric]:.2f}"

    def postprocess(self, source: str, output: str, word_tokenizer: str | None = None) -> str:
        """An output as users read it (a parser's: a tree over the source's words, repaired if need be).

        ``word_tokenizer``: the one the graph split the raw ``source`` with (``DecodeOptions.word_tokenizer``).
        """
        return output

    def score(self, sources: list[str], outputs: list[str], references: list, **options) -> dict:
        """``{metric: value, …}`` for raw ``outputs`` (before :meth:`postprocess`) against ``references``.

        ``options``: the metric's own (translation: sacreBLEU's ``lowercase`` and ``tokenize``).
        """
        raise NotImplementedError

"""Translation (section 6.1): parallel text, a shared SentencePiece vocabulary, sacreBLEU."""

from __future__ import annotations

import pipelines
from tf_transformer.bleu import read_test_set
from tf_transformer.bleu import score as bleu_score
from tf_transformer.tasks.base import Splits, Task


class Translation(Task):
    """Sources and targets are text; both sides train the shared vocabulary (section 5.1)."""

    name = "translation"
    metric = "bleu"
    splits = Splits("train", "val")

    def corpus(self, options, split: str) -> pipelines.ParallelText:
        return pipelines.find_split(options.data, split, options.src, options.tgt)

    def dev_set(self, options, limit: int) -> tuple[list[str], list[str]]:
        pairs = list(self.corpus(options, options.dev_split).pairs())[:limit]
        return [source for source, _ in pairs], [target for _, target in pairs]

    def read_test_set(self, source_path: str, reference_path: str) -> tuple[list[str], list[str]]:
        return read_test_set(source_path, reference_path)

    def summary(self, result: dict) -> str:
        moses = f"  Moses-tokenized BLEU {result['moses_bleu']:.2f}" if "moses_bleu" in result else ""
        return f"BLEU {result['bleu']:.2f} ({result['signature']})  chrF {result['chrf']:.2f}{moses}"

    def score(self, sources: list[str], outputs: list[str], references: list[str], **options) -> dict:
        return bleu_score(outputs, references, **options)

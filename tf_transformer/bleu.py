"""sacreBLEU and chrF of translations against references (detokenized, cased by default)."""

from __future__ import annotations

import sacrebleu

from pipelines import parallel_files


def read_test_set(source_path: str, reference_path: str) -> tuple[list[str], list[str]]:
    """Sources and references, validated and read like training data (``pipelines.ParallelText.pairs``).

    Reading them any other way could split or join lines differently and score
    misaligned pairs. Raises ``pipelines.DataError`` naming the file and line.
    """
    pairs = list(parallel_files(source_path, reference_path).pairs())
    return [source for source, _ in pairs], [reference for _, reference in pairs]


def score(hypotheses: list[str], references: list[str], lowercase: bool = False, tokenize: str = "13a") -> dict:
    """BLEU (with its signature) and chrF; plus lowercased 13a-tokenized BLEU for published comparisons."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU(lowercase=lowercase, tokenize=tokenize)
    result = bleu.corpus_score(hypotheses, [references])
    chrf = sacrebleu.metrics.CHRF()
    chrf_result = chrf.corpus_score(hypotheses, [references])
    lc = sacrebleu.metrics.BLEU(lowercase=True, tokenize="13a").corpus_score(hypotheses, [references])
    return {
        "bleu": round(result.score, 2),
        "chrf": round(chrf_result.score, 2),
        "signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "lc_tok_bleu": round(lc.score, 2),
        "sentences": len(hypotheses),
    }

"""sacreBLEU and chrF of translations against references (detokenized, cased by default).

Beside them, the BLEU most Multi30k papers report (Wu et al., 2021, among them): BLEU4 on
text lowercased, punctuation-normalized and tokenized as their data was, by Moses'
``lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG``
(:func:`moses_tokenized`). It differs from sacreBLEU's ``-lc`` in its tokens (Moses splits
and escapes where 13a does not, ``"`` → ``&quot;``) and in having no smoothing.
"""

from __future__ import annotations

import functools
import os

import sacrebleu
import sacremoses

from pipelines import parallel_files


def read_test_set(source_path: str, reference_path: str) -> tuple[list[str], list[str]]:
    """Sources and references, validated and read like training data (``pipelines.ParallelText.pairs``).

    Reading them any other way could split or join lines differently and score
    misaligned pairs. Raises ``pipelines.DataError`` naming the file and line.
    """
    pairs = list(parallel_files(source_path, reference_path).pairs())
    return [source for source, _ in pairs], [reference for _, reference in pairs]


def language_of(path: str) -> str | None:
    """The language a corpus file's suffix names among those Moses has rules for (``test.de`` → ``de``), else
    ``None`` (``reference.txt``)."""
    from sacremoses.corpus import NonbreakingPrefixes

    _, dot, suffix = os.path.basename(path).rpartition(".")
    suffix = suffix.lower() if dot else ""
    return suffix if suffix in set(NonbreakingPrefixes().available_langs.values()) else None


@functools.cache
def _moses(language: str) -> tuple[sacremoses.MosesPunctNormalizer, sacremoses.MosesTokenizer]:
    return sacremoses.MosesPunctNormalizer(lang=language), sacremoses.MosesTokenizer(lang=language)


def moses_tokenized(lines: list[str], language: str) -> list[str]:
    """``lines`` lowercased, then Moses' punctuation normalization and tokenization for ``language``.

    As Multi30k's own tokenized files were made (``data/task1/tok/*.lc.norm.tok.*`` of the
    multi30k/dataset repository): its test2016 German references come out identical, 12,103 tokens.
    Escaping as ``tokenizer.perl`` does (``&quot;``, ``&apos;``…), which the references have.
    """
    normalizer, tokenizer = _moses(language)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True) for line in lines]


def moses_bleu(hypotheses: list[str], references: list[str], language: str) -> sacrebleu.metrics.bleu.BLEUScore:
    """BLEU4 on :func:`moses_tokenized` text, unsmoothed (fairseq's and ``multi-bleu.perl``'s score)."""
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    return bleu.corpus_score(moses_tokenized(hypotheses, language), [moses_tokenized(references, language)])


def score(
    hypotheses: list[str],
    references: list[str],
    lowercase: bool = False,
    tokenize: str = "13a",
    language: str | None = None,
) -> dict:
    """BLEU (with its signature, length ratio) and chrF; lowercased 13a-tokenized BLEU; with the references'
    ``language``, the Moses-tokenized BLEU of the Multi30k papers (``moses_bleu``, :func:`moses_bleu`)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU(lowercase=lowercase, tokenize=tokenize)
    result = bleu.corpus_score(hypotheses, [references])
    chrf = sacrebleu.metrics.CHRF()
    chrf_result = chrf.corpus_score(hypotheses, [references])
    lc = sacrebleu.metrics.BLEU(lowercase=True, tokenize="13a").corpus_score(hypotheses, [references])
    scores = {
        "bleu": round(result.score, 2),
        "length_ratio": _ratio(result),
        "chrf": round(chrf_result.score, 2),
        "signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "lc_tok_bleu": round(lc.score, 2),
        "sentences": len(hypotheses),
    }
    if language:
        moses = moses_bleu(hypotheses, references, language)
        scores.update(moses_bleu=round(moses.score, 2), moses_length_ratio=_ratio(moses), moses_language=language)
    return scores


def _ratio(bleu: sacrebleu.metrics.bleu.BLEUScore) -> float:
    """Hypothesis tokens ÷ reference tokens: below 1, the brevity penalty takes its share."""
    return round(bleu.sys_len / max(bleu.ref_len, 1), 3)

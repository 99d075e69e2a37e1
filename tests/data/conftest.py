"""Shared by the pipeline tests: a SentencePiece model trained on the synthetic corpus."""

import pytest

from pipelines import Tokenizer, find_split, train_sentencepiece


@pytest.fixture(scope="package")
def tokenizer(corpus_dir, tmp_path_factory):
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    path = tmp_path_factory.mktemp("vocab") / "sp.model"
    train_sentencepiece(corpus.pairs(), str(path), vocab_size=120)
    return Tokenizer(str(path))

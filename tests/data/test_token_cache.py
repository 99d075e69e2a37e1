"""pipelines/token_cache.py: tokenized pairs cached on disk, reused, never half written."""

import os

import numpy as np
import pytest

import pipelines
from pipelines import find_split, training_dataset


def python_lengths(tokenizer, pairs):
    processor = tokenizer.python_processor()
    return {(len(processor.encode(s.strip())) + 1, len(processor.encode(t.strip())) + 1) for s, t in pairs}


def test_cache_is_reused_and_never_half_written(tmp_path, corpus_dir, tokenizer, monkeypatch):
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    cache = tmp_path / "cache"

    def broken(*args, **kwargs):
        raise RuntimeError("interrupted")

    real_tokenize = pipelines.token_cache.tokenize_pairs
    monkeypatch.setattr(pipelines.token_cache, "tokenize_pairs", broken)
    with pytest.raises(RuntimeError, match="interrupted"):
        training_dataset(corpus, tokenizer, tokens_per_batch=512, max_train_length=64, cache_dir=str(cache))
    assert os.listdir(cache) == []  # no half-written cache left behind

    monkeypatch.setattr(pipelines.token_cache, "tokenize_pairs", real_tokenize)
    first = training_dataset(corpus, tokenizer, tokens_per_batch=512, max_train_length=64, cache_dir=str(cache), seed=1)
    assert len(os.listdir(cache)) == 1
    monkeypatch.setattr(pipelines.token_cache, "tokenize_pairs", broken)  # a second run must not tokenize
    second = training_dataset(
        corpus, tokenizer, tokens_per_batch=512, max_train_length=64, cache_dir=str(cache), seed=1
    )
    assert second.stats == first.stats
    assert sum(int(np.count_nonzero(np.any(labels, axis=1))) for _, labels in second.dataset) == first.stats.kept


def test_runs_building_the_same_cache_at_once_both_succeed(tmp_path, corpus_dir, tokenizer, monkeypatch):
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    cache = tmp_path / "cache"
    real_chunk_examples = pipelines.token_cache.chunk_examples
    other = []

    def other_run_finishes_first(examples, seed=0):
        if not other:  # while this run tokenizes, another one builds and publishes the same cache
            other.append(None)
            other[0] = pipelines.cached_chunks(corpus, tokenizer, str(cache))
        return real_chunk_examples(examples, seed)

    monkeypatch.setattr(pipelines.token_cache, "chunk_examples", other_run_finishes_first)
    chunks, lengths = pipelines.cached_chunks(corpus, tokenizer, str(cache))
    assert len(os.listdir(cache)) == 1  # one cache, no staging left behind
    other_chunks, other_lengths = other[0]
    assert len(lengths) == corpus.num_lines and np.array_equal(lengths, other_lengths)
    assert python_lengths(tokenizer, corpus.pairs()) == {tuple(row) for row in lengths}
    rows = [(len(i), len(t)) for chunk in chunks for i, t in zip(chunk["inputs"], chunk["targets"], strict=True)]
    assert rows == [tuple(row) for row in lengths]  # the cache reads back whole


def test_a_failure_while_writing_the_cache_leaves_no_cache(tmp_path, corpus_dir, tokenizer, monkeypatch):
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    cache = tmp_path / "cache"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipelines.token_cache.np, "save", disk_full)  # after the chunks are written
    with pytest.raises(OSError, match="No space left"):
        pipelines.cached_chunks(corpus, tokenizer, str(cache))
    assert os.listdir(cache) == []
    monkeypatch.undo()
    partial = cache / pipelines.token_cache._cache_key(corpus, tokenizer)  # left by other means, e.g. a copy cut short
    partial.mkdir()
    (partial / "lengths.npy").write_bytes(b"cut short")
    _, lengths = pipelines.cached_chunks(corpus, tokenizer, str(cache))
    assert len(lengths) == corpus.num_lines and len(os.listdir(cache)) == 1

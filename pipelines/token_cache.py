"""Parallel text → tokenized examples, cached on disk in shuffled ragged chunks.

Example contract: ``{"inputs": int32[src_len], "targets": int32[tgt_len]}``,
both ending in EOS. The cache holds them in chunks of ``CHUNK_SIZE`` ragged
rows with the ``[pairs, 2]`` lengths beside them, so a training run reads the
corpus back without tokenizing and knows its lengths before reading a row.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from absl import logging

from pipelines.sources import ParallelText
from pipelines.vocab import EOS_ID, Tokenizer

CACHE_VERSION = 2
CHUNK_SIZE = 1024
_TOKENIZE_BATCH = 1024
_CACHE_SHUFFLE_BUFFER = 1_000_000


def tokenize_pairs(pairs: tf.data.Dataset, tokenizer: Tokenizer) -> tf.data.Dataset:
    """``(source, target)`` strings → ``{"inputs", "targets"}`` ids, each ending in EOS.

    Surrounding whitespace is stripped first; an empty side gives just ``[EOS]``.
    """

    def tokenize(source, target):
        def ids(text, tokenize):
            tokens = tokenize(tf.strings.strip(text))  # [batch, (len)]
            eos = tf.fill([tokens.nrows(), 1], tf.constant(EOS_ID, tf.int32))  # [batch, 1]
            return tf.concat([tokens, eos], axis=1)  # [batch, (len + 1)]

        return {"inputs": ids(source, tokenizer.tokenize), "targets": ids(target, tokenizer.tokenize_target)}

    return (
        pairs.batch(_TOKENIZE_BATCH)
        .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()  # ragged rows → dense int32[len]
    )


def _cache_key(corpus: ParallelText, tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256()
    digest.update(f"v{CACHE_VERSION}|{corpus.fingerprint()}|".encode())
    if tokenizer.target_symbols:  # the same files tokenized another way
        digest.update(f"symbols {tokenizer.symbol_pattern}|".encode())
    if tokenizer.language_codes:  # a source's leading >>xx<< as one piece (caches of before took it as text)
        digest.update(b"language codes|")
    digest.update(tokenizer.model_proto)
    return digest.hexdigest()[:20]


def chunk_examples(examples: tf.data.Dataset, seed: int = 0) -> tf.data.Dataset:
    """Examples → shuffled chunks of ``CHUNK_SIZE`` ragged rows (the on-disk cache layout).

    The one-time shuffle (seeded) spreads a corpus that is sorted or grouped in
    its files (Tatoeba is sorted by length) evenly over the chunks; epochs then
    reshuffle the chunks. Whole chunks make reading the cache fast.
    """
    return examples.shuffle(_CACHE_SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=False).ragged_batch(CHUNK_SIZE)


def cached_chunks(
    corpus: ParallelText, tokenizer: Tokenizer, cache_dir: str | None
) -> tuple[tf.data.Dataset, np.ndarray]:
    """Tokenized examples in ragged chunks, and the ``[pairs, 2]`` lengths in chunk order.

    With a ``cache_dir`` they are saved there once and later runs read them back
    without tokenizing. The key covers the files' paths, sizes and mtimes and the
    SentencePiece model. A cache is written into a staging directory and renamed
    into place whole, so a failed or killed run never leaves a directory that
    passes for a cache. Runs sharing ``cache_dir`` may build the same cache at
    once: the first renamed into place wins, and the others discard theirs and read it.
    """
    if cache_dir is None:
        chunks = chunk_examples(tokenize_pairs(corpus.dataset(), tokenizer)).cache()
        return chunks, _lengths(chunks)
    path = os.path.join(cache_dir, _cache_key(corpus, tokenizer))
    if not _is_complete(path):
        os.makedirs(cache_dir, exist_ok=True)
        staging = tempfile.mkdtemp(dir=cache_dir, prefix=".staging-")
        try:
            chunk_examples(tokenize_pairs(corpus.dataset(), tokenizer)).save(os.path.join(staging, "chunks"))
            lengths = _lengths(tf.data.Dataset.load(os.path.join(staging, "chunks")))
            np.save(os.path.join(staging, "lengths.npy"), lengths)
            with open(os.path.join(staging, _COMPLETE), "w") as handle:  # written last
                json.dump({"paths": corpus.paths, "fingerprint": corpus.fingerprint()}, handle)
            _publish(staging, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # already gone when it was renamed into place
        logging.info("Cached %d tokenized pairs of %s in %s", len(lengths), corpus.paths, path)
    lengths = np.load(os.path.join(path, "lengths.npy"))
    return tf.data.Dataset.load(os.path.join(path, "chunks")), lengths


_COMPLETE = "source.json"  # the last file a cache gets


def _is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, _COMPLETE))


def _publish(staging: str, path: str) -> None:
    """Renames the finished ``staging`` to ``path`` unless another run has put a whole cache there first."""
    try:
        os.rename(staging, path)  # fails onto a non-empty directory: two runs' files never mix
        return
    except OSError:
        if _is_complete(path):
            logging.info("Another run cached the same pairs in %s first; reading that", path)
            return
    # Not a whole cache (written by hand or by an older version): it goes, ours takes its place.
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.rename(staging, path)
    except OSError:
        if not _is_complete(path):  # not a third run that finished meanwhile
            raise


def _lengths(chunks: tf.data.Dataset) -> np.ndarray:
    pieces = [
        np.stack([chunk["inputs"].row_lengths().numpy(), chunk["targets"].row_lengths().numpy()], axis=1)
        for chunk in chunks
    ]
    return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros((0, 2), np.int32)

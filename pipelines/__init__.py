"""tf.data input: real parallel text → SentencePiece subwords → token-budget batches."""

from pipelines.batching import Buckets, bucket_by_length, make_buckets
from pipelines.dataset import CorpusStats, TrainingData, corpus_stats, to_features_and_labels, training_dataset
from pipelines.decoding_batches import decoding_dataset, restore_order
from pipelines.global_batches import part_bounds, replica_parts, update_weights
from pipelines.mixing import mix
from pipelines.sources import (
    DataError,
    ParallelText,
    find_split,
    parallel_files,
    parallel_prefix,
    tfds_pairs,
    tfds_to_files,
    tsv_file,
)
from pipelines.text_lines import line_dataset, read_lines, split_lines
from pipelines.token_cache import cached_chunks, tokenize_pairs
from pipelines.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, target_model_beside, train_sentencepiece

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "Buckets",
    "CorpusStats",
    "DataError",
    "ParallelText",
    "Tokenizer",
    "TrainingData",
    "bucket_by_length",
    "cached_chunks",
    "corpus_stats",
    "decoding_dataset",
    "find_split",
    "line_dataset",
    "make_buckets",
    "mix",
    "parallel_files",
    "parallel_prefix",
    "part_bounds",
    "read_lines",
    "replica_parts",
    "restore_order",
    "split_lines",
    "target_model_beside",
    "tfds_pairs",
    "tfds_to_files",
    "to_features_and_labels",
    "tokenize_pairs",
    "train_sentencepiece",
    "training_dataset",
    "tsv_file",
    "update_weights",
]

"""Source sentences batched by length for decoding, and the outputs put back in input order."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from pipelines.vocab import EOS_ID, Tokenizer


def decoding_dataset(
    sources: list[str], tokenizer: Tokenizer, tokens_per_batch: int = 8192, max_batch_size: int = 256
) -> tf.data.Dataset:
    """Source sentences batched by length for decoding: ``{"index": int64[b], "inputs": int32[b, len]}``.

    Sentences are sorted by length so batches carry little padding; each batch
    holds at most ``tokens_per_batch`` padded tokens (a longer sentence goes
    alone) and ``max_batch_size`` sentences. Nothing is dropped or truncated:
    feed the per-batch results and indices to :func:`restore_order`.
    """
    stripped = [text.strip() for text in sources]
    tokens = tokenizer.tokenize(tf.constant(stripped, tf.string)) if stripped else None
    rows = [np.append(row, EOS_ID).astype(np.int32) for row in tokens.numpy()] if stripped else []
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    batches: list[list[int]] = []
    for position in np.argsort(lengths, kind="stable"):  # ascending: the newest is the longest
        current = batches[-1] if batches else None
        if (
            current is None
            or len(current) >= max_batch_size
            or (len(current) + 1) * lengths[position] > tokens_per_batch
        ):
            batches.append([int(position)])
        else:
            current.append(int(position))

    def generate():
        for batch in batches:
            inputs = np.zeros((len(batch), int(lengths[batch].max())), np.int32)  # [b, len], 0 = padding
            for row, position in enumerate(batch):
                inputs[row, : lengths[position]] = rows[position]
            yield {"index": np.asarray(batch, np.int64), "inputs": inputs}

    return tf.data.Dataset.from_generator(
        generate,
        output_signature={"index": tf.TensorSpec([None], tf.int64), "inputs": tf.TensorSpec([None, None], tf.int32)},
    )


def restore_order(indices: list[np.ndarray], outputs: list, total: int) -> list:
    """Puts per-batch ``outputs`` back in the original order given each batch's ``indices``."""
    result = [None] * total
    for batch_indices, batch_outputs in zip(indices, outputs, strict=True):
        for index, output in zip(batch_indices, batch_outputs, strict=True):
            result[int(index)] = output
    missing = [i for i, value in enumerate(result) if value is None]
    if missing:
        raise ValueError(f"No output for {len(missing)} input(s), first at index {missing[0]}")
    return result

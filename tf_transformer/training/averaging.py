"""Checkpoint averaging (section 6.1: "averaging the last 5 checkpoints" for base, 20 for big)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

from tf_transformer.files import replace_directory, staging_directory, write_failed
from tf_transformer.run_dir import checkpoint_dir, checkpoints, load_weights, restore_model


def last_checkpoints(model_dir: str, last: int) -> list[str]:
    """The newest ``last`` checkpoints of ``model_dir``, oldest first."""
    directory = checkpoint_dir(model_dir)
    paths = checkpoints(directory)  # a garbled state file: the checkpoints on disk
    if not paths:
        raise FileNotFoundError(f"No checkpoints in {directory}")
    if last > len(paths):
        raise ValueError(f"--last {last} but {directory} keeps only {len(paths)} checkpoint(s)")
    return paths[-last:]


def average_checkpoints(model_dir: str, last: int = 5, output: str | None = None) -> str:
    """Writes a checkpoint whose model weights are the element-wise mean of the last ``last``.

    The mean is accumulated in float64 and cast back to each weight's dtype.
    The result goes to ``output`` (default ``model_dir/averaged``), written to
    a directory beside it and put in place atomically (:mod:`tf_transformer.files`).
    Returns the checkpoint prefix.
    """
    paths = last_checkpoints(model_dir, last)
    model, config = restore_model(model_dir, paths[0])
    sums = [np.zeros(w.shape, np.float64) for w in model.weights]
    for path in paths:
        load_weights(model, path, model_dir, config)
        for total, weight in zip(sums, model.weights, strict=True):
            total += np.asarray(weight, np.float64)
    for total, weight in zip(sums, model.weights, strict=True):
        weight.assign((total / len(paths)).astype(weight.dtype))
    output = os.path.abspath(output or os.path.join(model_dir, "averaged"))
    staging = staging_directory(output)
    try:
        tf.train.Checkpoint(model=model).write(os.path.join(staging, "ckpt"))
        with open(os.path.join(staging, "SOURCES"), "w") as handle:
            handle.write("\n".join(paths) + "\n")
        replace_directory(staging, output)  # a previous average stays whole until this one is in place
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, tf.errors.OpError | OSError):  # a full disk, a quota
            raise write_failed("average", output, error, os.path.exists(output)) from None
        raise
    return os.path.join(output, "ckpt")


def choose_averaging(
    model_dir: str,
    candidates: Iterable[int | str],
    evaluate: Callable[[str], dict],
    metric: str,
    report: Callable[[str], None] | None = None,
) -> tuple[int, dict]:
    """How many of the last checkpoints to average, chosen on a dev set by ``metric`` (higher is better).

    Section 6.1 averages a fixed number, written at fixed intervals; under a time budget the
    number of updates, and so the span the last ``n`` checkpoints cover, depends on the CPU,
    so the count is chosen on dev (never on a test set). Each count (capped at the
    checkpoints kept) is averaged into ``model_dir/averaged_<n>`` (the last checkpoint
    itself for 1) and scored by ``evaluate(checkpoint) -> dict``; ``report`` gets a line per
    count. Returns the best count and, for every count, ``(result, checkpoint, seconds)``.
    """
    available = len(checkpoints(checkpoint_dir(model_dir)))
    scores = {}
    for last in sorted({min(int(n), available) for n in candidates}):
        checkpoint = (
            last_checkpoints(model_dir, 1)[0]
            if last == 1
            else average_checkpoints(model_dir, last=last, output=os.path.join(model_dir, f"averaged_{last}"))
        )
        start = time.perf_counter()
        result = evaluate(checkpoint)
        scores[last] = (result, checkpoint, time.perf_counter() - start)
        if report:
            report(f"dev with the last {last} checkpoint(s) averaged: {result}")
    return max(scores, key=lambda n: scores[n][0][metric]), scores

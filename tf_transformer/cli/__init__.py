"""Thin command-line entry points over importable functions."""

from __future__ import annotations

from absl import flags


def define_thread_flags() -> None:
    """``--intra_op_threads`` / ``--inter_op_threads`` for the commands that decode (see :func:`apply_thread_flags`)."""
    flags.DEFINE_integer(
        "intra_op_threads",
        0,
        "Threads one TensorFlow op may split its work across (0: TensorFlow's default, all cores). "
        "1 for an export with --streams (tft-export).",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "inter_op_threads",
        0,
        "TensorFlow ops run side by side (0: TensorFlow's default). For an export with --streams N, N.",
        lower_bound=0,
    )


def apply_thread_flags() -> None:
    """Sets TensorFlow's thread pools from the flags; call before TensorFlow runs its first op."""
    import tensorflow as tf

    if flags.FLAGS.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(flags.FLAGS.intra_op_threads)
    if flags.FLAGS.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(flags.FLAGS.inter_op_threads)

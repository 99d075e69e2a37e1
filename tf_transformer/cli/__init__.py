"""Thin command-line entry points over importable functions."""

from __future__ import annotations

from absl import app, flags

from tf_transformer.cli.startup import start_tensorflow


def run_main(main) -> None:
    """``absl.app.run(main)``, with TensorFlow started quietly once the flags have parsed (``--help`` stays fast)."""

    def started(argv):
        start_tensorflow()
        return main(argv)

    app.run(started)


def check_model_flags(model: str | None, model_dir: str | None) -> None:
    """Exactly one of ``--model`` (an export's version directory) and ``--model_dir`` (a run), and it is one.

    Paths are read with ``tf.io.gfile``, as run directories are (``gs://`` included).
    """
    import os

    import tensorflow as tf

    from tf_transformer.run_dir import CONFIG_FILE

    if bool(model) == bool(model_dir):
        raise app.UsageError("Give exactly one of --model (an export) or --model_dir (a training run)")
    if model and not tf.io.gfile.exists(os.path.join(model, "saved_model.pb")):
        raise app.UsageError(f"--model {model}: no saved_model.pb there (give an export's version directory)")
    if model_dir and not tf.io.gfile.exists(os.path.join(model_dir, CONFIG_FILE)):
        raise app.UsageError(f"--model_dir {model_dir}: no config.json there (give a tft-train run directory)")


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


def apply_thread_flags(workers: int = 1) -> None:
    """Sets TensorFlow's thread pools from the flags; call before TensorFlow runs its first op.

    ``workers``: searches running at once (batches decoded side by side, times
    each batch's streams). Above 1, with ``--intra_op_threads`` left at 0,
    TensorFlow's intra-op pool (one for the process) gets ``cores / workers``
    threads, at least one: with one, every op runs whole on the thread of the
    search that runs it, instead of each op being split across all cores.
    ``--inter_op_threads`` left at 0 becomes at least ``workers``.
    """
    import os

    import tensorflow as tf

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    intra, inter = flags.FLAGS.intra_op_threads, flags.FLAGS.inter_op_threads
    if workers > 1:
        intra = intra or max(1, cores // workers)
        inter = inter or max(workers, cores)
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)

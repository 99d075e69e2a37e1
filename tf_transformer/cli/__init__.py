"""Thin command-line entry points over importable functions."""

from __future__ import annotations

import os
import sys

from absl import app, flags

from tf_transformer.cli.startup import start_tensorflow

# Flags defined through the helpers below (define_thread_flags) belong to the command module that
# calls them, as if it had defined them itself: absl counts them among its key flags, which --help shows.
flags.disclaim_key_flags()


def run_main(main) -> None:
    """``absl.app.run(main)``, with TensorFlow started quietly once the flags have parsed (``--help`` stays fast).

    ``--help`` (``-h``, ``--helpshort``) prints the command's module docstring and its own flags
    (see :func:`describe_command`) and exits with status 0; ``--helpfull`` adds absl's flags.
    """
    describe_command(sys.modules[main.__module__])

    def started(argv):
        start_tensorflow()
        return main(argv)

    app.run(started)


def describe_command(command) -> None:
    """Makes absl's short help (``--help``, and the usage a usage error prints) describe ``command``, a module.

    absl's short help is the docstring of ``__main__`` followed by the key flags of the module
    named ``sys.argv[0]``. Run as a console script (``tft-train``), ``__main__`` is the wrapper
    that pip generates, with no docstring and no flags, so the help listed no flag at all. The
    wrapper gets the command's docstring, without its reST markup, and the command's key flags.
    """
    main_module = sys.modules["__main__"]
    if command is not main_module:
        for flag in flags.FLAGS.get_key_flags_for_module(command.__name__):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    if command.__doc__:
        main_module.__doc__ = command.__doc__.replace("``", "")
    app.define_help_flags()
    for flag in (_HelpFlag(), _HelpshortFlag()):
        flags.DEFINE_flag(flag, module_name=app.__name__)  # replaces absl's flag of the same name


class _HelpFlag(app.HelpFlag):
    """absl's ``--help``, also as ``-h``, with exit status 0: help that was asked for is no error."""

    SHORT_NAME = "h"

    def __init__(self):
        super().__init__()
        self.allow_override = True

    def parse(self, arg):
        if self._parse(arg):
            try:
                app.usage(shorthelp=True, writeto_stdout=True)
                print("\nTry --helpfull to get a list of all flags.", flush=True)
            except BrokenPipeError:  # tft-train --help | head: the reader has all it wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)


class _HelpshortFlag(_HelpFlag):
    """``--helpshort``, an alias for ``--help``."""

    NAME = "helpshort"
    SHORT_NAME = None


def check_model_flags(model: str | None, model_dir: str | None) -> None:
    """Exactly one of ``--model`` (an export's version directory) and ``--model_dir`` (a run), and it is one.

    Paths are read with ``tf.io.gfile``, as run directories are (``gs://`` included).
    """
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
        "1 for an export with --batch_parts (tft-export).",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "inter_op_threads",
        0,
        "TensorFlow ops run side by side (0: TensorFlow's default). For an export with --batch_parts N, N.",
        lower_bound=0,
    )


def apply_thread_flags(workers: int = 1) -> None:
    """Sets TensorFlow's thread pools from the flags; call before TensorFlow runs its first op.

    ``workers``: searches running at once (batches decoded side by side, times
    each batch's parts). Above 1, with ``--intra_op_threads`` left at 0,
    TensorFlow's intra-op pool (one for the process) gets ``cores / workers``
    threads, at least one: with one, every op runs whole on the thread of the
    search that runs it, instead of each op being split across all cores.
    ``--inter_op_threads`` left at 0 becomes at least ``workers``.
    """
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


def model_task(model: str | None, model_dir: str | None):
    """The task of an export (what it records) or of a run directory (its ``config.json``)."""
    from tf_transformer.tasks import get_task, task_of_run

    if model:
        from tf_transformer.exporting.export_info import read_export_info

        info = read_export_info(model)
        return get_task(info.task, info.linearization)
    return task_of_run(model_dir)


def read_test_set(task, model: str | None, src: str | None, targets: str, targets_flag: str):
    """``(sources, references)`` of a test set for ``tft-evaluate`` and ``tft-score``: read and checked by
    ``task`` (each file exists, is UTF-8, the two are line-aligned; a parser's sources default to its trees'
    words) and, for an export ``model``, every source within its maximum length. Any problem is a
    ``UsageError`` naming the file and line. ``targets_flag`` names the targets' flag (``--ref``, ``--tgt``)."""
    from absl import app

    from pipelines import DataError
    from tf_transformer.inference.batch_translation import checked_sources

    try:
        if src is None and task.name != "parsing":
            raise app.UsageError(f"--src is required: the source sentences, line-aligned with {targets_flag}")
        sources, references = task.read_test_set(src, targets)  # exists, UTF-8, aligned
        if model:  # every line within the export's maximum source length, or the line named
            sources = list(checked_sources(sources, model, src or targets))
    except DataError as error:
        raise app.UsageError(str(error)) from None
    return sources, references

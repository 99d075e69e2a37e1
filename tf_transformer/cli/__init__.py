"""Thin command-line entry points over importable functions."""

from __future__ import annotations

import os
import sys

from absl import app, flags

from tf_transformer.cli.startup import start_tensorflow


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


def model_task(model: str | None, model_dir: str | None):
    """The task of an export (what it records) or of a run directory (its ``config.json``); one of another
    format is a usage error that names both formats."""
    from absl import app

    from tf_transformer.formats import FormatError
    from tf_transformer.tasks import get_task, task_of_run

    try:
        if model:
            from tf_transformer.exporting.export_info import read_export_info

            info = read_export_info(model)
            return get_task(info.task, info.linearization, info.closings)
        return task_of_run(model_dir)
    except FormatError as error:
        raise app.UsageError(str(error)) from None


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
            # A parser's sources are the words of trees: split already (its export's translate_tokens)
            sources = list(checked_sources(sources, model, src or targets, task.word_tokenizer is not None))
    except DataError as error:
        raise app.UsageError(str(error)) from None
    return sources, references

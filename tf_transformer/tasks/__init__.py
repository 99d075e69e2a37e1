"""The toolkit's tasks by name: translation (section 6.1) and constituency parsing (section 6.3)."""

from __future__ import annotations

from tf_transformer.tasks.base import Splits, Task

TASK_NAMES = ("translation", "parsing")


def get_task(name: str | None, linearization: str | None = None, closings: str | None = None) -> Task:
    """The task ``name`` (``None``: translation).

    ``linearization``: a parser's (``--linearization``; ``None``: the default scheme, ``words``);
    ``closings``: its closing brackets (``--closings``; ``None``: labelled).
    """
    name = name or "translation"
    if name == "translation":
        from tf_transformer.tasks.translation import Translation

        return Translation()
    if name == "parsing":
        from tf_transformer.tasks.parsing.task import Parsing

        return Parsing(linearization, closings)
    raise ValueError(f"Unknown task {name!r}; choose one of: {', '.join(TASK_NAMES)}")


def task_of_run(model_dir: str) -> Task:
    """The task a run directory records (``config.json``'s ``run.task``)."""
    from tf_transformer.run_dir import load_run

    run = load_run(model_dir)[1]
    return get_task(run.get("task"), run.get("linearization"), run.get("closings"))


def run_tokenizer(model_dir: str):
    """The run's tokenizer (``sp.model``) for its task's targets."""
    from tf_transformer.run_dir import vocabulary_path

    return task_of_run(model_dir).tokenizer(vocabulary_path(model_dir))


__all__ = ["TASK_NAMES", "Splits", "Task", "get_task", "run_tokenizer", "task_of_run"]

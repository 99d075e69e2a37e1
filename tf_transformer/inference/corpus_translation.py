"""A whole corpus translated by a teacher, in shards run apart, each resumable: sequence-level distillation's data.

Kim & Rush (2016) train a student on its teacher's translations of the training
set; translating millions of lines takes hours, so the work is cut into ``N``
shards of consecutive lines (``--shard i/N``) that processes or machines run
independently (a cluster's array job: one task per shard), and joined in order
afterwards (:func:`join_shards`).

A shard commits its work a chunk at a time: the chunk's translations are
appended to the shard's file and flushed to disk, then a small progress file
records how many lines and bytes are committed (written whole or not at all,
:mod:`tf_transformer.files`). A shard killed at any point (``kill -9``
included) and run again cuts its file back to the committed bytes and goes on
from the next chunk. The chunks are the same lines as in an uninterrupted run,
so their batches, and hence their translations, are the same: the file is
identical, neither losing nor repeating a line. The progress file also records
the settings that shape the output (the model, batching, decoding); a run with
other settings refuses to continue what another started.

Lines are handled as ``tft-translate`` handles them: an empty line translates
to an empty line, and a line over the teacher's maximum source length, which
it cannot translate, gets an empty line too; both are counted. The student's
training drops pairs with an empty side (:mod:`pipelines.dataset`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import time
from collections.abc import Callable

from tf_transformer.files import save_json, sync_path

_SHARD = re.compile(r"([0-9]+)/([0-9]+)")


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: the ``index``-th of ``count`` runs of consecutive lines of nearly equal length."""

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ValueError(f"Shard {self.index}/{self.count}: the index runs from 0 to {self.count - 1}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"i/N"`` (``--shard``)."""
        match = _SHARD.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"--shard must be i/N (e.g. 0/4), got {text!r}")
        return cls(int(match[1]), int(match[2]))

    def lines(self, total: int) -> range:
        """The line numbers (from 0) of this shard of a corpus of ``total`` lines."""
        return range(total * self.index // self.count, total * (self.index + 1) // self.count)

    def path(self, output: str) -> str:
        """This shard's file for the corpus output ``output`` (``output`` itself for one shard)."""
        return output if self.count == 1 else f"{output}-{self.index:05d}-of-{self.count:05d}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def progress_path(shard_path: str) -> str:
    return f"{shard_path}.progress"


def count_lines(path: str) -> int:
    """Lines of the file at ``path`` (a last line without its newline counted too)."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


@dataclasses.dataclass
class ShardReport:
    """What a shard run did: lines committed in all, by this run, the empty and skipped ones, and its pace."""

    shard: str
    path: str
    lines: int
    done: int
    translated_now: int
    empty: int
    over_limit: int
    seconds: float

    @property
    def complete(self) -> bool:
        return self.done == self.lines

    def summary(self) -> str:
        """One line for a person: the lines committed, this run's share and time, the empty and skipped ones."""
        return (
            f"shard {self.shard}: {self.path}: {self.done:,} lines ({self.translated_now:,} in this run, "
            f"{self.seconds:.0f} s); {self.empty} empty, {self.over_limit} over the model's maximum source length "
            "(written as empty lines)"
        )


def progress_line(shard: Shard, done: int, lines: int, rate: float) -> str:
    """A shard's progress for a person: lines done, the rate of this run and the time left at that rate."""
    left = (lines - done) / rate if rate > 0 else 0
    return f"shard {shard}: {done:,}/{lines:,} lines · {rate:.1f} lines/s · {left / 60:.1f} min left"


def translate_shard(
    translate: Callable[[list[str]], list],
    source: str,
    output: str,
    shard: Shard,
    settings: dict,
    chunk_size: int = 10_000,
    translate_chunk: Callable | None = None,
    too_long: Callable[[str], bool] | None = None,
    report: Callable[[int, int, float], None] | None = None,
) -> ShardReport:
    """Translates ``shard`` of the lines of ``source`` into :meth:`Shard.path` of ``output``, or goes on with it.

    Args:
      translate: ``translate(batch of lines) → [(translation, score), …]``.
      source: the corpus, one sentence per line.
      output: the corpus translation's path; the shard writes its own file beside it.
      shard: which lines.
      settings: what shapes the output (model, decoding and batching settings),
        recorded and compared on resuming.
      chunk_size: lines translated between commits.
      translate_chunk: ``translate_chunk(translate, lines) → results in order``
        (default: :func:`~tf_transformer.inference.batch_translation.translate_stream`
        over one chunk, with the settings' ``batch_size``).
      too_long: whether a line is over the teacher's maximum source length
        (``None``: no line is).
      report: ``report(lines done, lines of the shard, lines per second of this run)`` after each chunk.
    """
    from pipelines import split_lines
    from tf_transformer.inference.batch_translation import translate_stream

    if translate_chunk is None:
        batch_size = settings.get("batch_size", 64)

        def translate_chunk(translate, lines):
            return list(translate_stream(translate, lines, batch_size, chunk_size=len(lines) or 1))

    total = count_lines(source)
    span = shard.lines(total)
    path = shard.path(output)
    recorded = {"source": os.path.abspath(source), "source_lines": total, "shard": str(shard), "chunk_size": chunk_size}
    recorded["settings"] = settings
    state = _resume(path, recorded)
    started, translated_now = time.monotonic(), 0
    with open(path, "r+b" if os.path.exists(path) else "w+b") as out, open(source, "rb") as handle:
        out.truncate(state["bytes"])  # what a killed run wrote after its last commit
        out.seek(state["bytes"])
        lines = itertools.islice(split_lines(handle, source), span.start + state["done"], span.stop)
        while chunk := list(itertools.islice(lines, chunk_size)):
            long_lines = {i for i, line in enumerate(chunk) if too_long is not None and too_long(line)}
            kept = [line for i, line in enumerate(chunk) if i not in long_lines]
            results = iter(translate_chunk(translate, kept) if kept else [])
            texts = ["" if i in long_lines else _text(next(results)) for i in range(len(chunk))]
            out.write("".join(f"{text}\n" for text in texts).encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())  # the lines are on disk before the progress says so
            state["done"] += len(chunk)
            state["bytes"] = out.tell()
            state["empty"] += sum(not line.strip() for line in chunk)
            state["over_limit"] += len(long_lines)
            save_json(progress_path(path), {**recorded, **state})
            translated_now += len(chunk)
            if report is not None:
                report(state["done"], len(span), translated_now / max(time.monotonic() - started, 1e-9))
    if state["done"] == len(span) and not os.path.exists(progress_path(path)):
        save_json(progress_path(path), {**recorded, **state})  # an empty shard is complete too
    sync_path(path)
    return ShardReport(
        str(shard),
        path,
        len(span),
        state["done"],
        translated_now,
        state["empty"],
        state["over_limit"],
        time.monotonic() - started,
    )


def _text(result) -> str:
    """A result's 1-best translation: ``(text, score)`` or an n-best list of them."""
    if isinstance(result, list):
        result = result[0]
    return result[0]


def _resume(path: str, recorded: dict) -> dict:
    """The committed state of the shard at ``path`` (nothing committed: a fresh start), checked against ``recorded``."""
    fresh = {"done": 0, "bytes": 0, "empty": 0, "over_limit": 0}
    progress = progress_path(path)
    if not os.path.exists(progress):
        return fresh
    with open(progress, encoding="utf-8") as handle:
        try:
            saved = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{progress}: not a progress file ({error}); remove it and {path} to start again"
            ) from None
    differ = sorted(key for key in recorded if saved.get(key) != recorded[key])
    if differ:
        raise ValueError(
            f"{path} was started with other {', '.join(differ)} ({progress}): its lines would not match; "
            f"run with the same ones, or remove {path} and {progress} to start again"
        )
    size = os.path.getsize(path) if os.path.exists(path) else 0
    if size < saved["bytes"]:
        raise ValueError(
            f"{path} holds {size} bytes but {saved['bytes']} were committed ({progress}): the file was changed; "
            "remove both to start again"
        )
    return {key: saved[key] for key in fresh}


def join_shards(output: str, count: int) -> int:
    """Joins the ``count`` complete shard files of ``output`` into ``output``, in order; the lines written.

    A shard not complete (its progress file says so, or it has none) is a
    ``ValueError`` naming it, and nothing is written.
    """
    from tf_transformer.files import staging_name

    paths = [Shard(i, count).path(output) for i in range(count)]
    lines = 0
    for path in paths:
        progress = progress_path(path)
        if not os.path.exists(progress):
            raise ValueError(f"Shard {path} has not started (no {progress})")
        with open(progress, encoding="utf-8") as handle:
            saved = json.load(handle)
        span = Shard.parse(saved["shard"]).lines(saved["source_lines"])
        if saved["done"] != len(span):
            raise ValueError(f"Shard {path} is not complete: {saved['done']} of {len(span)} lines")
        lines += saved["done"]
    if count == 1:  # the one shard's file is the output
        return lines
    staging = staging_name(os.path.abspath(output))
    try:
        with open(staging, "wb") as joined:
            for path in paths:
                with open(path, "rb") as part:
                    while block := part.read(1 << 20):
                        joined.write(block)
            joined.flush()
            os.fsync(joined.fileno())
        os.replace(staging, output)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    sync_path(output)
    return lines

"""One way to read lines of text, shared by every reader in Python and in tf.data.

Vocabulary training, the tf.data pipeline, dev BLEU, ``tft-evaluate`` and
``tft-translate`` must see the same lines, or pairs shift against each other.
``tf.data.TextLineDataset`` splits on ``\\n`` only and drops every ``\\r`` (not
just the one before ``\\n``), while Python's text mode also splits on a lone
``\\r``. So the rule is tf.data's, and the Python side follows it:

- every ``\\r`` is removed, then lines are split on ``\\n``;
- text after the last ``\\n`` is one more line unless it is empty;
- a UTF-8 byte order mark at the start of the first line is removed;
- a line with invalid UTF-8 or a NUL byte (binary data, or UTF-16 text) is an
  error naming the file and line;
- lines are read whole, however long.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import tensorflow as tf

BOM = "\ufeff"


class DataError(ValueError):
    """Bad input data; the message names the file, line or field."""


def split_lines(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """The lines of a binary stream (a file opened with ``"rb"``, ``sys.stdin.buffer``), decoded.

    ``name`` is the file named in errors.
    """
    for number, raw in enumerate(stream, start=1):  # binary streams split on b"\n" only
        raw = raw.replace(b"\r", b"")
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        elif not raw:  # the unterminated end of the file held nothing but \r
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"{name}:{number}: invalid UTF-8 at byte {error.start} of the line ({raw[:60]!r}…)"
            ) from None
        if "\0" in line:
            raise DataError(
                f"{name}:{number}: NUL byte at character {line.index(chr(0))} of the line "
                "(binary data, or text not in UTF-8 such as UTF-16?)"
            )
        if number == 1 and line.startswith(BOM):
            line = line[1:]
        yield line


def read_lines(path: str) -> Iterator[str]:
    """The lines of the file at ``path`` (see the module docstring for the rule)."""
    with open(path, "rb") as stream:
        yield from split_lines(stream, path)


def _strip_bom(line):
    return tf.strings.regex_replace(line, f"^{BOM}", "", replace_global=False)


def line_dataset(path: str) -> tf.data.Dataset:
    """The lines of ``path`` as a tf.data pipeline, equal byte for byte to :func:`read_lines`.

    ``TextLineDataset`` already drops every ``\\r`` and ends like ``read_lines``;
    only the byte order mark is left to remove. Invalid UTF-8 and NUL bytes pass
    through: validate the file first (``pipelines.sources`` does).
    """
    lines = tf.data.TextLineDataset(path)
    return lines.take(1).map(_strip_bom).concatenate(lines.skip(1))

"""The one check of a format version, for what one command writes and a later one reads.

A run directory's ``config.json`` (:data:`tf_transformer.run_dir.RUN_FORMAT`) and an export's
``assets.extra/tf_transformer.json`` (:data:`tf_transformer.exporting.export_info.EXPORT_FORMAT`) record
the format they are written in, under :data:`FORMAT_KEY`. A reader reads its own format only: a file of
another format, or one that records none, is refused with a message naming both numbers and the file.
Imports nothing (an export is read without TensorFlow).
"""

from __future__ import annotations

FORMAT_KEY = "format"


class FormatError(ValueError):
    """A file written in another format than this version of tf_transformer reads."""


def check_format(values: dict, path: str, artifact: str, expected: int, remedy: str) -> None:
    """Raises :class:`FormatError` unless the JSON object ``values`` read from ``path`` records ``expected``.

    ``artifact`` names what the file belongs to ("run directory", "export"); ``remedy`` says what to do.
    """
    found = values.get(FORMAT_KEY) if isinstance(values, dict) else None
    if type(found) is int and found == expected:
        return
    recorded = f"format {found}" if found is not None else "format none (not recorded)"
    raise FormatError(f"{path}: {artifact} {recorded}, this tf_transformer reads format {expected}; {remedy}")

"""Where parallel text comes from: a pair of files, a prefix + language codes, TSV, or TFDS.

Every local source is validated before anything is built on it, and bad input
stops with an error that names the file and line: a missing file, invalid
UTF-8, a NUL byte, mismatched line counts, a TSV line without exactly one tab.
Lines are read by :mod:`pipelines.text_lines`, the same way in Python and tf.data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator

import tensorflow as tf
from absl import logging

from pipelines.text_lines import DataError, line_dataset, read_lines


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """A validated parallel corpus on disk.

    Either two line-aligned files (``source_path``/``target_path``) or one TSV
    file (``tsv_path``, ``source<TAB>target`` per line).
    """

    source_path: str | None = None
    target_path: str | None = None
    tsv_path: str | None = None
    num_lines: int = 0

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.tsv_path,) if self.tsv_path else (self.source_path, self.target_path)

    def fingerprint(self) -> str:
        """Identifies the content cheaply (path, size, mtime) for cache keys."""
        parts = []
        for path in self.paths:
            stat = os.stat(path)
            parts.append(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}")
        return "|".join(parts)

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Yields (source, target) strings in file order: the pairs :meth:`dataset` gives, in Python."""
        if self.tsv_path:
            for line in read_lines(self.tsv_path):
                source, target = line.split("\t")
                yield source, target
            return
        try:
            yield from zip(read_lines(self.source_path), read_lines(self.target_path), strict=True)
        except ValueError as error:  # the files changed since they were validated
            if isinstance(error, DataError):
                raise
            raise DataError(f"{self.source_path} and {self.target_path} no longer have equal line counts") from None

    def dataset(self) -> tf.data.Dataset:
        """``(source, target)`` string pairs as a tf.data pipeline, in file order."""
        if self.tsv_path:
            lines = line_dataset(self.tsv_path)
            return lines.map(_split_tsv, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return tf.data.Dataset.zip((line_dataset(self.source_path), line_dataset(self.target_path)))


def _split_tsv(line):
    fields = tf.strings.split(line, "\t")
    return fields[0], fields[1]


def _check_file(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{what} file not found: {path}")
    if not os.path.isfile(path):
        raise DataError(f"{what} path is not a file: {path}")


def count_valid_lines(path: str, tsv: bool = False) -> int:
    """Counts lines, raising :class:`DataError` at the first invalid line (UTF-8, NUL byte, TSV fields)."""
    count = 0
    for count, line in enumerate(read_lines(path), start=1):
        if tsv and line.count("\t") != 1:
            raise DataError(
                f"{path}:{count}: expected 'source<TAB>target' (exactly one tab), found {line.count(chr(9))} tabs"
            )
    return count


def parallel_files(source_path: str, target_path: str) -> ParallelText:
    """Validates a pair of line-aligned files (existence, UTF-8, equal line counts)."""
    _check_file(source_path, "Source")
    _check_file(target_path, "Target")
    source_lines = count_valid_lines(source_path)
    target_lines = count_valid_lines(target_path)
    if source_lines != target_lines:
        raise DataError(
            f"Line counts differ: {source_path} has {source_lines} lines but {target_path} has {target_lines}; "
            "parallel files must be line-aligned"
        )
    return ParallelText(source_path=source_path, target_path=target_path, num_lines=source_lines)


def parallel_prefix(prefix: str, src: str, tgt: str) -> ParallelText:
    """``prefix.src`` / ``prefix.tgt`` (e.g. ``data/train`` + ``en`` + ``de``)."""
    return parallel_files(f"{prefix}.{src}", f"{prefix}.{tgt}")


def tsv_file(path: str) -> ParallelText:
    """Validates a ``source<TAB>target`` file."""
    _check_file(path, "TSV")
    return ParallelText(tsv_path=path, num_lines=count_valid_lines(path, tsv=True))


TFDS_PREFIX = "tfds:"


def find_split(data: str, split: str, src: str, tgt: str) -> ParallelText:
    """Resolves ``split`` of a corpus given as a directory, a prefix, a TSV file or a TFDS name.

    ``data`` may be a directory holding ``{split}.{src}``/``{split}.{tgt}`` (or
    ``{split}.tsv``), a file prefix when ``split`` is empty, or
    ``tfds:NAME`` (e.g. ``tfds:wmt14_translate/de-en``): that TFDS dataset's
    split, written once to text files by :func:`tfds_to_files`.
    """
    if data.startswith(TFDS_PREFIX):
        return tfds_to_files(data[len(TFDS_PREFIX) :], split, src, tgt)
    if os.path.isdir(data):
        tsv = os.path.join(data, f"{split}.tsv")
        if os.path.exists(tsv) and not os.path.exists(os.path.join(data, f"{split}.{src}")):
            return tsv_file(tsv)
        return parallel_prefix(os.path.join(data, split), src, tgt)
    if data.endswith(".tsv"):
        return tsv_file(data)
    return parallel_prefix(data if not split else f"{data}{split}", src, tgt)


def tfds_pairs(name: str, split: str, src: str, tgt: str, data_dir: str | None = None) -> tf.data.Dataset:
    """``(source, target)`` strings of a TFDS translation dataset, e.g. ``wmt14_translate/de-en``.

    Downloads and prepares the dataset into ``data_dir`` when it is not there yet.
    Offline, that fails: the error says how to prepare the data elsewhere or use
    local files instead.
    """
    import tensorflow_datasets as tfds

    try:
        dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    except Exception as error:  # tfds raises many types for a failed download
        raise DataError(
            f"Could not load TFDS dataset {name!r} (split {split!r}, data_dir {data_dir!r}): {error}\n"
            "This machine may be offline. Either prepare it where there is network access "
            f"(`tfds build {name} --data_dir DIR`) and copy DIR here (pass it as the data_dir), "
            f"or use local parallel text files instead (e.g. --data path/to/corpus --src {src} --tgt {tgt}, "
            f"which reads {{split}}.{src} and {{split}}.{tgt})."
        ) from error
    spec = dataset.element_spec
    missing = [code for code in (src, tgt) if code not in spec]
    if missing:
        raise DataError(f"TFDS dataset {name!r} has no field(s) {missing}; its fields are {sorted(spec)}")
    return dataset.map(lambda example: (example[src], example[tgt]), num_parallel_calls=tf.data.AUTOTUNE)


def text_cache_dir() -> str:
    """Where TFDS splits are written as text: ``$TFT_TEXT_CACHE`` or ``~/.cache/tf_transformer/text``."""
    return os.environ.get("TFT_TEXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tf_transformer", "text")


def tfds_text_dir(full_name: str, data_dir: str) -> str:
    """Where a TFDS dataset's splits go as text, under :func:`text_cache_dir`.

    ``full_name`` is TFDS's ``name/config/version`` and ``data_dir`` the
    directory TFDS reads that version from: a new version, or the same name
    prepared in another ``data_dir``, gets its own text files instead of
    reusing text written from different data.
    """
    digest = hashlib.sha256(os.path.abspath(os.path.expanduser(data_dir)).encode()).hexdigest()[:10]
    return os.path.join(text_cache_dir(), f"{full_name.replace('/', '__')}__{digest}")


def tfds_to_files(
    name: str, split: str, src: str, tgt: str, out_dir: str | None = None, data_dir: str | None = None
) -> ParallelText:
    """Writes a TFDS translation split as ``{split}.{src}``/``{split}.{tgt}`` text files, once.

    The files go to ``out_dir`` (default: :func:`tfds_text_dir` of the dataset's
    version and TFDS data directory), through temporary names renamed into
    place, so an interrupted export is redone and never read half-written. Line
    breaks inside a sentence become spaces (one sentence per line); nothing is
    dropped. Vocabulary training, caching and evaluation then read plain files,
    like any other corpus.
    """
    if out_dir is None:
        import tensorflow_datasets as tfds

        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except Exception as error:  # an unknown name, or a builder that needs the network
            raise DataError(f"No TFDS dataset {name!r} (data_dir {data_dir!r}): {error}") from error
        out_dir = tfds_text_dir(builder.info.full_name, builder.data_dir)
    paths = [os.path.join(out_dir, f"{split}.{code}") for code in (src, tgt)]
    if not all(os.path.exists(path) for path in paths):
        os.makedirs(out_dir, exist_ok=True)
        pairs = tfds_pairs(name, split, src, tgt, data_dir=data_dir)
        temporary = [f"{path}.tmp-{os.getpid()}" for path in paths]
        try:
            with (
                open(temporary[0], "w", encoding="utf-8") as source,
                open(temporary[1], "w", encoding="utf-8") as target,
            ):
                for source_text, target_text in pairs.as_numpy_iterator():
                    source.write(" ".join(source_text.decode("utf-8").splitlines()) + "\n")
                    target.write(" ".join(target_text.decode("utf-8").splitlines()) + "\n")
            for tmp, path in zip(temporary, paths, strict=True):
                os.replace(tmp, path)
        finally:
            for tmp in temporary:
                if os.path.exists(tmp):
                    os.remove(tmp)
        logging.info("Wrote TFDS %s split %r as text to %s", name, split, out_dir)
    return parallel_files(*paths)

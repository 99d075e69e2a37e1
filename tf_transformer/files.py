"""Writing files so that a path holds a whole version or none: JSON, copies, directories, and their errors.

Every write goes to a staging name beside its destination and is then put in
place by a rename, so a crash, a kill or a full disk never leaves half a file
where a reader looks. JSON files and copies go through ``tf.io.gfile`` (local
paths and TensorFlow's filesystems such as ``gs://``; on an object store a
rename is a copy). Directories (exports, averaged checkpoints) are local: on
Linux the old and new are exchanged in one ``renameat2(RENAME_EXCHANGE)`` call;
where that is missing (other systems, some filesystems) the old one is first
renamed aside, so that it survives, under a name that says what it is,
whatever happens next.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import tempfile

import tensorflow as tf


class WriteError(OSError):
    """Writing failed (a full disk, a quota, a file size limit): what was being written has been
    removed and what was there before is intact; the message says which."""


def write_failed(what: str, path: str, error: BaseException, existed: bool) -> WriteError:
    """The :class:`WriteError` for ``what`` at ``path`` after its staging copy was removed."""
    before = f"the {what} already at {path} is unchanged" if existed else "nothing was written"
    return WriteError(f"Could not write the {what} {path} ({reason(error)}); is the disk full? {before.capitalize()}")


def reason(error: BaseException) -> str:
    """Why a write failed: the system's words for an ``OSError`` (``File too large``), else the first line."""
    return getattr(error, "strerror", None) or first_line(error)


def save_json(path: str, value) -> None:
    """Writes ``value`` as JSON to ``path`` by way of a temporary file and a rename (atomic on a
    POSIX filesystem; on an object store such as GCS a rename is a copy)."""
    tmp = f"{path}.tmp"
    try:
        with tf.io.gfile.GFile(tmp, "w") as handle:
            handle.write(json.dumps(value, indent=2, sort_keys=True))
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except (OSError, tf.errors.OpError) as error:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise WriteError(f"Could not write {path} ({reason(error)}); the previous file is unchanged") from None


def copy_file(source: str, target: str) -> None:
    """Copies ``source`` to ``target`` (any ``tf.io.gfile`` paths) by way of ``target.partial`` and a rename."""
    partial = f"{target}.partial"
    try:
        tf.io.gfile.copy(source, partial, overwrite=True)
        tf.io.gfile.rename(partial, target, overwrite=True)
    except (OSError, tf.errors.OpError) as error:
        if tf.io.gfile.exists(partial):
            tf.io.gfile.remove(partial)
        raise WriteError(f"Could not write {target} ({reason(error)}); nothing was written") from None


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swaps the directories ``a`` and ``b`` atomically; False where the system cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # not supported by this system or filesystem
        return False
    raise OSError(code, os.strerror(code), a, None, b)


def replace_directory(staging: str, destination: str) -> None:
    """Puts the complete directory ``staging`` at ``destination``, replacing what is there.

    Both must be on the same filesystem (``staging`` beside ``destination``).
    Afterwards ``staging`` no longer exists. If this fails, ``destination``
    still holds its old content (or, on a system without an atomic exchange,
    the old content sits beside it as ``.<name>.replaced-*``, named in the error).
    """
    if not os.path.exists(destination):
        os.replace(staging, destination)
        return
    if _exchange(staging, destination):
        shutil.rmtree(staging)  # now the old version
        return
    aside = tempfile.mkdtemp(dir=os.path.dirname(destination), prefix=f".{os.path.basename(destination)}.replaced-")
    os.rmdir(aside)
    os.replace(destination, aside)
    try:
        os.replace(staging, destination)
    except OSError as error:
        raise OSError(f"Could not put {staging} at {destination}; the previous version is at {aside}") from error
    shutil.rmtree(aside)


def staging_directory(destination: str) -> str:
    """A new empty directory beside ``destination`` (same filesystem) to write its next version into."""
    parent = os.path.dirname(os.path.abspath(destination))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(destination)}.partial-")


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:500] if str(error).strip() else type(error).__name__

"""Writing files so that a path holds a whole version or none, durably: JSON, copies, directories, and their errors.

Every write goes to a staging name beside its destination and is then put in
place by a rename, so a crash, a kill or a full disk never leaves half a file
where a reader looks. On a local disk the staging file (or every file and
directory of a staging directory) is flushed to the disk (``fsync``) before the
rename, and the directory holding the new name after it: a power cut then
leaves the old version or the whole new one, never a name that points at data
the disk has not written yet. JSON files and copies also go through
``tf.io.gfile`` for TensorFlow's filesystems such as ``gs://`` (there a rename
is a copy and nothing is flushed by hand). Directories (exports, averaged
checkpoints) are local: on Linux the old and new are exchanged in one
``renameat2(RENAME_EXCHANGE)`` call; where that is missing (other systems,
some filesystems) the old one is first renamed aside, so that it survives,
under a name that says what it is, whatever happens next.

Staging names say whose they are: ``.NAME.partial-PID@HOST-RANDOM``. A process
killed while writing leaves one behind; the next write into the same directory
on that machine removes every one whose process is gone
(:func:`remove_leftovers`), and never one a live process is still writing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import re
import secrets
import shutil
import socket

import tensorflow as tf


class WriteError(OSError):
    """Writing failed (a full disk, a quota, a file size limit): what was being written has been
    removed and what was there before is intact; the message says which."""


class ReadError(OSError):
    """Reading failed for a reason other than damage (permissions, storage briefly unavailable): nothing
    was changed, and the run must not go on as if the file were not there; the message says which."""


def write_failed(what: str, path: str, error: BaseException, existed: bool) -> WriteError:
    """The :class:`WriteError` for ``what`` at ``path`` after its staging copy was removed."""
    before = f"the {what} already at {path} is unchanged" if existed else "nothing was written"
    return WriteError(f"Could not write the {what} {path} ({reason(error)}); is the disk full? {before.capitalize()}")


def reason(error: BaseException) -> str:
    """Why a write failed: the system's words for an ``OSError`` (``File too large``), else the first line."""
    return getattr(error, "strerror", None) or first_line(error)


def is_local(path: str) -> bool:
    """Whether ``path`` is a local or mounted path, not one of TensorFlow's filesystems (``gs://``, ``ram://``)."""
    return "://" not in path


# Staging names: what is being written, by which process on which machine, and a random part.
_HOST = socket.gethostname()
_STAGING = re.compile(r"^\..+\.partial-(?P<pid>\d+)@(?P<host>.+)-[0-9a-f]{8}$")


def staging_name(destination: str) -> str:
    """A new staging path beside ``destination`` (same directory, so the rename stays on one filesystem)."""
    directory, name = os.path.split(destination)
    return os.path.join(directory, f".{name}.partial-{os.getpid()}@{_HOST}-{secrets.token_hex(4)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_leftovers(directory: str) -> list[str]:
    """Removes the staging files and directories in ``directory`` that processes of this machine, now gone,
    left behind (killed while writing). Returns their paths. Local directories only; others are left as they are."""
    if not is_local(directory):
        return []
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        match = _STAGING.match(name)
        if not match or match["host"] != _HOST or _alive(int(match["pid"])):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        removed.append(path)
    return removed


def sync_path(path: str) -> None:
    """Flushes the file or directory ``path`` to the disk (``fsync``); a filesystem that cannot sync a
    directory is passed over."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # e.g. directories on some filesystems
            raise
    finally:
        os.close(fd)


def sync_tree(root: str) -> None:
    """Flushes every file and directory under ``root`` (``root`` included), children before their directory."""
    for directory, _, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                sync_path(path)
        sync_path(directory)


def _directory(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a staging file renamed into place (flushed first on a local disk).

    Raises the underlying error; the staging file is removed and ``path`` is unchanged.
    """
    if not is_local(path):
        staging = staging_name(path)
        try:
            with tf.io.gfile.GFile(staging, "wb") as handle:
                handle.write(data)
            tf.io.gfile.rename(staging, path, overwrite=True)
        except BaseException:
            with contextlib.suppress(tf.errors.OpError, OSError):
                tf.io.gfile.remove(staging)
            raise
        return
    directory = _directory(path)
    remove_leftovers(directory)
    staging = staging_name(os.path.abspath(path))
    try:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's permissions
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(staging)
        raise
    sync_path(directory)


def save_json(path: str, value) -> None:
    """Writes ``value`` as JSON to ``path`` whole (:func:`write_bytes`), or raises a :class:`WriteError`."""
    try:
        write_bytes(path, json.dumps(value, indent=2, sort_keys=True).encode())
    except (OSError, tf.errors.OpError) as error:
        raise WriteError(f"Could not write {path} ({reason(error)}); the previous file is unchanged") from None


def copy_file(source: str, target: str) -> None:
    """Copies ``source`` to ``target`` (any ``tf.io.gfile`` paths) whole (:func:`write_bytes`), by way of
    memory: for small files (a vocabulary)."""
    try:
        with tf.io.gfile.GFile(source, "rb") as handle:
            data = handle.read()
        write_bytes(target, data)
    except (OSError, tf.errors.OpError) as error:
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
    Every file and directory of ``staging`` is flushed to the disk before the
    rename, the directories of both names after it. Afterwards ``staging`` no
    longer exists. If this fails, ``destination`` still holds its old content
    (or, on a system without an atomic exchange, the old content sits beside it
    as ``.<name>.replaced-*``, named in the error).
    """
    sync_tree(staging)
    parents = {_directory(staging), _directory(destination)}
    if not os.path.exists(destination):
        os.replace(staging, destination)
    elif _exchange(staging, destination):
        shutil.rmtree(staging)  # now the old version
    else:
        aside = os.path.join(
            _directory(destination), f".{os.path.basename(destination)}.replaced-{secrets.token_hex(4)}"
        )
        os.replace(destination, aside)
        try:
            os.replace(staging, destination)
        except OSError as error:
            raise OSError(f"Could not put {staging} at {destination}; the previous version is at {aside}") from error
        shutil.rmtree(aside)
    for parent in sorted(parents):
        sync_path(parent)


def staging_directory(destination: str) -> str:
    """A new empty directory beside ``destination`` (same filesystem) to write its next version into.

    What killed processes left beside it is removed first (:func:`remove_leftovers`).
    """
    parent = _directory(destination)
    os.makedirs(parent, exist_ok=True)
    remove_leftovers(parent)
    path = staging_name(os.path.join(parent, os.path.basename(os.path.abspath(destination))))
    os.mkdir(path)  # the umask's permissions, as the rename will publish them
    return path


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:500] if str(error).strip() else type(error).__name__

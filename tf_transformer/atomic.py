"""Replacing a directory so that its path always holds a complete version, the old or the new.

Exports and averaged checkpoints are written to a staging directory beside
their destination and then put in place. Removing the old directory first and
renaming the new one after leaves a moment when neither is there: a crash, a
kill or a full disk at that moment loses the old one. On Linux the two are
exchanged in one ``renameat2(RENAME_EXCHANGE)`` call; where that is missing
(other systems, some filesystems) the old one is first renamed aside, so that
it survives, under a name that says what it is, whatever happens next.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import tempfile

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

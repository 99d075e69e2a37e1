"""Directories replaced so that their path always holds a whole version, the old or the new."""

import errno
import os
import signal
import subprocess
import sys

import pytest

from tf_transformer import files


def make(directory, text):
    directory.mkdir()
    (directory / "file").write_text(text)
    return directory


@pytest.mark.parametrize("exchange", [True, False])
def test_the_new_version_replaces_the_old(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)  # systems without renameat2
    destination = make(tmp_path / "export", "old")
    staging = make(tmp_path / ".export.partial", "new")
    files.replace_directory(str(staging), str(destination))
    assert (destination / "file").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # nothing left beside it
    files.replace_directory(str(make(tmp_path / "fresh.partial", "first")), str(tmp_path / "fresh"))
    assert (tmp_path / "fresh" / "file").read_text() == "first"


def test_a_failed_replacement_keeps_the_old_version_in_place(tmp_path, monkeypatch):
    def full_disk(a, b):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_exchange", full_disk)
    destination = make(tmp_path / "export", "old")
    staging = make(tmp_path / ".export.partial", "new")
    with pytest.raises(OSError, match="No space"):
        files.replace_directory(str(staging), str(destination))
    assert (destination / "file").read_text() == "old"


def test_without_an_exchange_the_old_version_survives_beside_it(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    destination = make(tmp_path / "export", "old")
    staging = make(tmp_path / ".export.partial", "new")
    real_replace = files.os.replace
    calls = []

    def second_fails(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError(errno.EIO, "I/O error")
        return real_replace(a, b)

    monkeypatch.setattr(files.os, "replace", second_fails)
    with pytest.raises(OSError, match="previous version is at") as caught:
        files.replace_directory(str(staging), str(destination))
    aside = calls[0][1]
    assert aside in str(caught.value) and open(f"{aside}/file").read() == "old"


# Durability: a rename puts a name in place; only what was flushed (fsync) before it survives a power cut.


class Syncs:
    """Every ``os.fsync`` as ``(path, what probe() said at that moment)``: what was flushed, and when."""

    def __init__(self, monkeypatch, probe):
        self.calls = []
        real = os.fsync

        def fsync(fd):
            self.calls.append((os.readlink(f"/proc/self/fd/{fd}"), probe()))
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def when(self, path) -> list:
        return [seen for synced, seen in self.calls if synced == str(path)]


def _content(path):
    return path.read_bytes() if path.is_file() else None


def test_save_json_flushes_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text('{"old": 1}')
    syncs = Syncs(monkeypatch, lambda: _content(path))
    files.save_json(str(path), {"new": 2})
    new = path.read_bytes()
    staged = [(p, seen) for p, seen in syncs.calls if p != str(tmp_path) and seen == b'{"old": 1}']
    assert staged, f"the new file was not flushed before it replaced the old one: {syncs.calls}"
    assert new in syncs.when(tmp_path), f"the directory was not flushed after the rename: {syncs.calls}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_copy_file_flushes_the_copy_before_the_rename(tmp_path, monkeypatch):
    source, target = tmp_path / "a" / "sp.model", tmp_path / "b" / "sp.model"
    source.parent.mkdir()
    target.parent.mkdir()
    source.write_bytes(b"pieces")
    syncs = Syncs(monkeypatch, lambda: _content(target))
    files.copy_file(str(source), str(target))
    assert [p for p, seen in syncs.calls if seen is None and p != str(target.parent)], syncs.calls
    assert b"pieces" in syncs.when(target.parent), syncs.calls
    assert sorted(p.name for p in target.parent.iterdir()) == ["sp.model"]


@pytest.mark.parametrize("exchange", [True, False])
def test_a_directory_is_flushed_whole_before_it_replaces_the_old_one(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    destination = make(tmp_path / "export", "old")
    staging = make(tmp_path / ".export.partial", "new")
    (staging / "variables").mkdir()
    (staging / "variables" / "data").write_text("weights")
    syncs = Syncs(monkeypatch, lambda: _content(destination / "file"))
    files.replace_directory(str(staging), str(destination))
    for part in (staging / "file", staging / "variables" / "data", staging / "variables", staging):
        assert syncs.when(part) == [b"old"], f"{part} was not flushed before the rename: {syncs.calls}"
    assert b"new" in syncs.when(tmp_path), f"the parent was not flushed after the rename: {syncs.calls}"


_KILLED_WHILE_WRITING = """
import os, signal, sys
from tf_transformer import files
staging = files.staging_directory(sys.argv[1])
open(os.path.join(staging, "half"), "w").write("half of an export")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_what_a_killed_process_left_is_removed_at_the_next_start(tmp_path):
    export = tmp_path / "saved_models" / "m" / "1"
    killed = subprocess.run([sys.executable, "-c", _KILLED_WHILE_WRITING, str(export)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    leftovers = [p.name for p in export.parent.iterdir()]
    assert len(leftovers) == 1 and ".partial" in leftovers[0], leftovers
    mine = files.staging_directory(str(export.parent / "3"))  # a write of this process, still going on
    files.replace_directory(files.staging_directory(str(export.parent / "2")), str(export.parent / "2"))
    assert sorted(p.name for p in export.parent.iterdir()) == sorted(["2", os.path.basename(mine)])

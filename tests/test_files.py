"""Directories replaced so that their path always holds a whole version, the old or the new."""

import errno

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

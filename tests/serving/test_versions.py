"""ModelVersions: the highest version served, new ones picked up, a broken one leaves the served one in place."""

import json
import pathlib
import time

import pytest

from tf_transformer.exporting.export_info import EXPORT_INFO
from tf_transformer.serving.rest_api import NotFound
from tf_transformer.serving.versions import ModelVersions


class Loaded:
    def __init__(self, path, version):
        if (pathlib.Path(path) / "broken").exists():
            raise ValueError(f"cannot read {path}/saved_model.pb\nmore detail")
        self.path, self.version = path, version

    def warm_up(self):
        return 0, 0.0


def add_version(base, number, broken=False):
    directory = base / str(number)
    directory.mkdir(parents=True)
    (directory / "saved_model.pb").write_bytes(b"graph")
    if broken:
        (directory / "broken").write_text("x")
    return directory


def states(versions):
    return {
        row["version"]: (row["state"], row["status"]["error_code"]) for row in versions.status()["model_version_status"]
    }


def test_newest_served_new_one_picked_up_broken_one_skipped_until_fixed(tmp_path):
    base = tmp_path / "m"
    add_version(base, 1)
    add_version(base, 3)
    (base / "7").mkdir()  # no saved_model.pb yet: not a version
    (base / "tmp").mkdir()
    versions = ModelVersions(str(base), load=Loaded)
    versions.start(poll_seconds=0)
    assert versions.name == "m" and versions.servable().version == 3
    assert states(versions) == {"3": ("AVAILABLE", "OK")}

    broken = add_version(base, 4, broken=True)
    versions.poll()
    assert versions.servable().version == 3  # still serving the last good version
    assert states(versions) == {"4": ("END", "UNKNOWN"), "3": ("AVAILABLE", "OK")}
    assert "cannot read" in versions.status("4")["model_version_status"][0]["status"]["error_message"]
    versions.poll()
    assert versions.servable().version == 3  # not retried while its files are unchanged

    (broken / "broken").unlink()  # fixed in place: loaded on the next poll
    versions.poll()
    assert versions.servable().version == 4
    assert states(versions) == {"4": ("AVAILABLE", "OK"), "3": ("END", "OK")}
    with pytest.raises(NotFound, match="Version 3 .* not being served"):
        versions.servable("3")
    with pytest.raises(NotFound, match="not known"):
        versions.status("9")


def test_polling_in_the_background(tmp_path):
    base = tmp_path / "m"
    add_version(base, 1)
    versions = ModelVersions(str(base), load=Loaded)
    versions.start(poll_seconds=0.05)
    try:
        add_version(base, 2)
        deadline = time.monotonic() + 10
        while versions.servable().version != 2:
            assert time.monotonic() < deadline, "version 2 was not picked up"
            time.sleep(0.05)
    finally:
        versions.stop()


def test_one_version_directory_serves_that_version_only(tmp_path):
    base = tmp_path / "m"
    one = add_version(base, 1)
    add_version(base, 2)
    versions = ModelVersions(str(one), load=Loaded)
    versions.start(poll_seconds=0.05)
    versions.poll()
    assert versions.servable().version == 1 and versions.name == "m"
    versions.stop()


def test_nothing_loadable_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No SavedModel"):
        ModelVersions(str(tmp_path / "missing"), load=Loaded)
    base = tmp_path / "m"
    add_version(base, 1, broken=True)
    with pytest.raises(FileNotFoundError, match="could be loaded.*cannot read"):
        ModelVersions(str(base), load=Loaded).start(0)
    base.joinpath("2").mkdir()
    with pytest.raises(FileNotFoundError, match="could be loaded"):
        ModelVersions(str(tmp_path / "m" / "2"), load=Loaded).start(0)


def test_a_version_of_another_export_format_fails_to_load_saying_so(tmp_path):
    """The server's own loader (Servable) refuses an export of another format before loading its graph."""
    base = tmp_path / "m"
    old = add_version(base, 1)
    (old / EXPORT_INFO).parent.mkdir()
    (old / EXPORT_INFO).write_text(json.dumps({"format": 0, "signatures": ["serving_default"]}))
    with pytest.raises(FileNotFoundError, match="could be loaded") as refused:
        ModelVersions(str(base)).start(0)
    assert f"{old / EXPORT_INFO}: export format 0, this tf_transformer reads format 1" in str(refused.value)


def test_latest_two_takes_the_next_version_when_one_fails_and_retires_old_ones_after_loads(tmp_path):
    from tf_transformer.serving.versions import VersionPolicy

    base = tmp_path / "m"
    for number in (1, 2, 3):
        add_version(base, number)
    add_version(base, 4, broken=True)
    versions = ModelVersions(str(base), load=Loaded, policy=VersionPolicy("latest", 2))
    versions.start(poll_seconds=0)
    assert [s.version for s in versions.served()] == [3, 2]  # 4 failed: 2 takes its place in the same poll
    assert states(versions)["4"] == ("END", "UNKNOWN")
    add_version(base, 5)
    versions.poll()
    assert [s.version for s in versions.served()] == [5, 3]
    assert states(versions)["2"] == ("END", "OK") and versions.servable().version == 5

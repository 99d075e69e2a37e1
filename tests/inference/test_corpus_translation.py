"""A corpus translated in shards, each resumable: sharded equals unsharded, a killed shard resumes to the same file."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tf_transformer.inference.corpus_translation import (
    Shard,
    count_lines,
    join_shards,
    progress_path,
    translate_shard,
)

SETTINGS = {"model": "stand-in", "batch_size": 4}


def translate(batch):
    """A stand-in teacher: each line reversed and upper-cased, with a score."""
    return [(line[::-1].upper(), -1.0) for line in batch]


def write_corpus(path, n=103):
    lines = [f"line {i} " + "word " * (i % 7) for i in range(n)]
    lines[5] = ""  # an empty line translates to an empty line
    lines[40] = "too long " * 30  # over the stand-in's limit: an empty line, counted
    path.write_text("\n".join(lines) + "\n")
    return lines


def too_long(line):
    return len(line.split()) > 50


def run(source, output, shard, **kwargs):
    return translate_shard(
        translate, str(source), str(output), shard, SETTINGS, chunk_size=10, too_long=too_long, **kwargs
    )


def test_shard_spans_cover_the_corpus_once():
    assert [list(Shard(i, 3).lines(10)) for i in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert Shard.parse(" 2/5 ") == Shard(2, 5) and str(Shard(2, 5)) == "2/5"
    for bad in ("5/5", "1", "-1/2", "a/b"):
        with pytest.raises(ValueError, match="shard|Shard"):
            Shard.parse(bad)


def test_sharded_then_joined_equals_unsharded(tmp_path):
    lines = write_corpus(tmp_path / "train.en")
    whole = run(tmp_path / "train.en", tmp_path / "one.de", Shard())
    assert whole.complete and (whole.empty, whole.over_limit) == (1, 1)
    expected = ["" if i == 40 else line[::-1].upper() for i, line in enumerate(lines)]
    assert (tmp_path / "one.de").read_text().split("\n")[:-1] == expected
    reports = [run(tmp_path / "train.en", tmp_path / "three.de", Shard(i, 3)) for i in (2, 0, 1)]  # any order
    assert sum(report.lines for report in reports) == len(lines)
    assert join_shards(str(tmp_path / "three.de"), 3) == len(lines)
    assert (tmp_path / "three.de").read_bytes() == (tmp_path / "one.de").read_bytes()
    assert count_lines(str(tmp_path / "three.de")) == len(lines)


def test_join_refuses_a_shard_not_complete(tmp_path):
    write_corpus(tmp_path / "train.en")
    run(tmp_path / "train.en", tmp_path / "out.de", Shard(0, 2))
    with pytest.raises(ValueError, match="has not started"):
        join_shards(str(tmp_path / "out.de"), 2)
    assert not (tmp_path / "out.de").exists()


def test_a_crash_after_a_partial_write_resumes_to_the_same_file(tmp_path):
    write_corpus(tmp_path / "train.en")
    run(tmp_path / "train.en", tmp_path / "whole.de", Shard(1, 2))
    calls = []

    def failing(batch):
        calls.append(len(batch))
        if sum(calls) > 30:  # the fourth chunk of 10 lines fails, after three were committed
            raise RuntimeError("killed")
        return translate(batch)

    with pytest.raises(RuntimeError):
        translate_shard(
            failing, str(tmp_path / "train.en"), str(tmp_path / "cut.de"), Shard(1, 2), SETTINGS, 10, too_long=too_long
        )
    shard_file = tmp_path / "cut.de-00001-of-00002"
    with open(shard_file, "ab") as handle:
        handle.write(b"HALF A LINE WRITTEN BEFORE THE KILL")  # past the last commit
    assert json.loads(open(progress_path(str(shard_file))).read())["done"] == 30
    report = run(tmp_path / "train.en", tmp_path / "cut.de", Shard(1, 2))
    assert report.complete and report.translated_now == report.lines - 30
    assert shard_file.read_bytes() == (tmp_path / "whole.de-00001-of-00002").read_bytes()
    again = run(tmp_path / "train.en", tmp_path / "cut.de", Shard(1, 2))  # a finished shard does nothing
    assert again.translated_now == 0 and shard_file.read_bytes() == (tmp_path / "whole.de-00001-of-00002").read_bytes()


def test_resuming_with_other_settings_is_refused(tmp_path):
    write_corpus(tmp_path / "train.en")
    run(tmp_path / "train.en", tmp_path / "out.de", Shard())
    with pytest.raises(ValueError, match="started with other settings"):
        translate_shard(translate, str(tmp_path / "train.en"), str(tmp_path / "out.de"), Shard(), {"model": "b"}, 10)
    with pytest.raises(ValueError, match="started with other chunk_size"):
        translate_shard(translate, str(tmp_path / "train.en"), str(tmp_path / "out.de"), Shard(), SETTINGS, 20)
    (tmp_path / "out.de").write_text("shorter")
    with pytest.raises(ValueError, match="the file was changed"):
        run(tmp_path / "train.en", tmp_path / "out.de", Shard())


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.inference.test_corpus_translation import SETTINGS, too_long, translate
    from tf_transformer.inference.corpus_translation import Shard, translate_shard

    def slow(batch):
        time.sleep(0.02)
        return translate(batch)

    translate_shard(slow, {source!r}, {output!r}, Shard(0, 1), SETTINGS, 10, too_long=too_long)
    """
)


@pytest.mark.slow
def test_kill_9_at_any_point_then_resume_gives_the_identical_file(tmp_path):
    write_corpus(tmp_path / "train.en", n=400)
    run(tmp_path / "train.en", tmp_path / "whole.de", Shard())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = CHILD.format(root=root, source=str(tmp_path / "train.en"), output=str(tmp_path / "killed.de"))
    progress = progress_path(str(tmp_path / "killed.de"))

    def done():
        try:
            return json.loads(open(progress).read())["done"]
        except (FileNotFoundError, json.JSONDecodeError):
            return 0

    for target, pause in ((50, 0.0), (160, 0.013), (270, 0.029)):  # killed at a different point each time
        child = subprocess.Popen([sys.executable, "-c", script])
        deadline = time.monotonic() + 120
        while done() < target:
            assert child.poll() is None and time.monotonic() < deadline, "the shard did not get that far"
            time.sleep(0.005)
        time.sleep(pause)  # mid-chunk: between two commits
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert target <= done() < 400
    assert subprocess.run([sys.executable, "-c", script], timeout=300).returncode == 0
    assert (tmp_path / "killed.de").read_bytes() == (tmp_path / "whole.de").read_bytes()

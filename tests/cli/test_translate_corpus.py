"""tft-translate over a corpus file: --output committed a chunk at a time, --shard i/N, --join N."""

from tests.commands import run_command

LINES = ["zeta", "alpha beta gamma delta epsilon", "", "omega", "haus baum", "kappa sigma", "theta"] * 3


def translate(*flags, **kwargs):
    result = run_command("tft-translate", *flags, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_shards_joined_equal_one_output_and_standard_output(tiny_export, tmp_path):
    source = tmp_path / "train.en"
    source.write_text("\n".join(LINES) + "\n")
    model = ["--model", str(tiny_export), "--batch_size", "3", "--chunk_size", "4"]
    streamed = translate(*model, input=source.read_text()).stdout
    whole = translate(*model, "--input", str(source), "--output", str(tmp_path / "whole.de"))
    assert (tmp_path / "whole.de").read_text() == streamed
    assert f"shard 0/1: {tmp_path / 'whole.de'}: 21 lines (21 in this run" in whole.stderr and "3 empty" in whole.stderr
    for index in (1, 0):
        translate(*model, "--input", str(source), "--output", str(tmp_path / "sharded.de"), "--shard", f"{index}/2")
    joined = translate("--output", str(tmp_path / "sharded.de"), "--join", "2")
    assert "21 lines from 2 shards" in joined.stderr
    assert (tmp_path / "sharded.de").read_text() == streamed
    again = translate(*model, "--input", str(source), "--output", str(tmp_path / "whole.de"))
    assert "(0 in this run" in again.stderr  # finished: nothing to do


def test_corpus_flag_mistakes(tiny_export, tmp_path):
    for flags, words in [
        (["--output", str(tmp_path / "o")], "give --input"),
        (["--shard", "0/2"], "give --output"),
        (["--input", "x", "--output", str(tmp_path / "o"), "--nbest", "2"], "drop --nbest"),
        (["--input", "x", "--output", str(tmp_path / "o"), "--shard", "2/2"], "index runs from 0 to 1"),
        (["--join", "2"], "give --output"),
        (["--output", str(tmp_path / "o"), "--join", "2"], "has not started"),
    ]:
        result = run_command("tft-translate", "--model", str(tiny_export), *flags)
        assert result.returncode != 0 and words in result.stderr, (flags, result.stderr[-500:])

"""tft-translate: order kept across batches and workers, n-best from a run, flags and formats checked."""

import subprocess

import numpy as np
import pytest

from tests.commands import BIN, run_command


def test_translate_cli_keeps_input_order(tiny_export):
    lines = ["zeta", "alpha beta gamma delta epsilon", "", "omega"]
    result = run_command(
        "tft-translate",
        "--model",
        str(tiny_export),
        "--batch_size",
        "2",
        "--workers",
        "2",
        input="\n".join(lines) + "\n",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == 4 and outputs[2] == ""
    assert "translated 4" in result.stderr
    # One sentence, TensorFlow's thread pools set by flag.
    single = run_command(
        "tft-translate",
        "--model",
        str(tiny_export),
        "--intra_op_threads",
        "1",
        "--inter_op_threads",
        "2",
        input="omega\n",
    )
    assert single.stdout.split("\n")[0] == outputs[3]


@pytest.mark.slow
def test_translate_cli_prints_alignments(tiny_export):
    import re

    result = run_command(
        "tft-translate",
        "--model",
        str(tiny_export),
        "--alignment",
        "--scores",
        input="alpha beta gamma\n\nzeta omega\n",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("\t") for line in result.stdout.split("\n")[:-1]]
    assert len(rows) == 3 and all(len(row) == 3 for row in rows) and rows[1][1:] == ["", ""]
    for _, text, alignment in rows:
        assert re.fullmatch(r"(\d+-\d+( \d+-\d+)*)?", alignment) and len(alignment.split()) == len(text.split())
    refused = run_command("tft-translate", "--model_dir", "anything", "--alignment")
    assert refused.returncode != 0 and "--alignment needs --model" in refused.stderr


@pytest.mark.slow
def test_translate_cli_streams_chunk_by_chunk(tiny_export):
    """Forty lines in chunks of 5: each chunk's translations come out before the next line is even sent."""
    import queue
    import threading

    from tf_transformer.inference.batch_translation import export_translate, translate_stream

    lines = [" ".join(["zeta", "alpha", "omega", "beta"][: 1 + i % 4]) + f" {'kappa ' * (i % 3)}" for i in range(40)]
    stream = translate_stream(export_translate(str(tiny_export)), lines, batch_size=4, chunk_size=5)
    expected = [text for text, _ in stream]  # the batches the command makes
    process = subprocess.Popen(
        [str(BIN / "tft-translate"), "--model", str(tiny_export), "--batch_size", "4", "--chunk_size", "5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    out = queue.Queue()
    threading.Thread(target=lambda: [out.put(line.rstrip("\n")) for line in process.stdout], daemon=True).start()
    try:
        got = []
        for start in range(0, 40, 5):
            process.stdin.write("".join(line + "\n" for line in lines[start : start + 5]))
            process.stdin.flush()
            for _ in range(5):  # this chunk's lines arrive while the input is still open
                try:
                    got.append(out.get(timeout=300))
                except queue.Empty:
                    raise AssertionError(f"no translation of chunk {start // 5} before more input") from None
        process.stdin.close()
        assert process.wait(60) == 0 and out.empty()
    finally:
        process.kill()
    assert got == expected


def test_translate_stream_holds_at_most_one_chunk_of_a_long_input():
    """10,000 generated lines in chunks of 50 (a stub model): a line is never read more than a chunk ahead of the
    translations written, so memory is bounded by the chunk size, not by the input's length."""
    from tf_transformer.inference.batch_translation import translate_stream

    chunk_size, chunks = 50, 200
    count = {"read": 0, "written": 0, "most_ahead": 0}

    def text(number):
        return f"line {number} " + "word " * (number % 9)  # lengths vary: batches are sorted within a chunk

    def generated():  # made as it is read: the input is never whole in memory
        for number in range(chunk_size * chunks):
            count["read"] += 1
            count["most_ahead"] = max(count["most_ahead"], count["read"] - count["written"])
            yield text(number)

    def translate(batch):
        assert len(batch) <= 8
        return [line.upper() for line in batch]

    stream = translate_stream(translate, generated(), batch_size=8, chunk_size=chunk_size)
    for number, translation in enumerate(stream):
        assert translation == text(number).upper()  # in input order
        count["written"] += 1
    assert count["read"] == count["written"] == chunk_size * chunks
    assert count["most_ahead"] <= chunk_size, count


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad, reason",
    [
        ("bad \xff", "<stdin>:6: invalid UTF-8"),
        ("zeta " * 600, "<stdin>:6: 601 tokens (EOS included) is longer than this model's maximum source length"),
    ],
)
def test_translate_cli_keeps_what_was_translated_when_a_line_fails(tiny_export, bad, reason):
    data = "zeta\n" * 3 + "alpha\n" * 2 + bad + "\nomega\n"
    result = subprocess.run(
        [str(BIN / "tft-translate"), "--model", str(tiny_export), "--chunk_size", "5"],
        input=data.encode("latin-1"),
        capture_output=True,
        timeout=600,
    )
    assert result.returncode != 0 and reason.encode() in result.stderr, result.stderr[-2000:]
    assert len(result.stdout.decode().split("\n")[:-1]) == 5  # the first chunk, written before the failure


@pytest.mark.slow
def test_translate_cli_from_a_run_with_nbest(tiny_run, tiny_export):
    lines = ["zeta", "alpha beta"]
    result = run_command(
        "tft-translate", "--model_dir", str(tiny_run), "--beam_size", "3", "--nbest", "2", input="\n".join(lines) + "\n"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("\t") for line in result.stdout.strip("\n").split("\n")]
    assert [r[0] for r in rows] == ["0", "0", "1", "1"]
    assert float(rows[0][1]) >= float(rows[1][1]) and float(rows[2][1]) >= float(rows[3][1])
    parts = run_command(
        "tft-translate",
        "--model_dir",
        str(tiny_run),
        "--beam_size",
        "3",
        "--nbest",
        "2",
        "--batch_parts",
        "2",
        "--intra_op_threads",
        "1",
        "--inter_op_threads",
        "2",
        input="\n".join(lines) + "\n",
    )
    assert parts.returncode == 0, parts.stderr[-3000:]
    split_rows = [line.split("\t") for line in parts.stdout.strip("\n").split("\n")]
    assert [(r[0], r[2]) for r in split_rows] == [(r[0], r[2]) for r in rows]  # one sentence per part: same n-best
    np.testing.assert_allclose([float(r[1]) for r in split_rows], [float(r[1]) for r in rows], atol=2e-4)
    # An export's options signature: the same n-best as the run at the same settings (the export's input + 10).
    same = ["--beam_size", "2", "--nbest", "2", "--max_extra_length", "10"]
    from_run = run_command("tft-translate", "--model_dir", str(tiny_run), *same, input="\n".join(lines) + "\n")
    from_export = run_command("tft-translate", "--model", str(tiny_export), *same, input="\n".join(lines) + "\n")
    assert from_export.returncode == 0, from_export.stderr[-3000:]
    run_rows = [line.split("\t") for line in from_run.stdout.strip("\n").split("\n")]
    export_rows = [line.split("\t") for line in from_export.stdout.strip("\n").split("\n")]
    assert [(r[0], r[2]) for r in export_rows] == [(r[0], r[2]) for r in run_rows] and len(run_rows) == 4
    np.testing.assert_allclose([float(r[1]) for r in export_rows], [float(r[1]) for r in run_rows], atol=2e-4)
    refused = run_command("tft-translate", "--model", str(tiny_export), "--beam_size", "3", input="zeta\n")
    assert refused.returncode != 0 and "beam_size must be one of 1, 2, 4, 8" in refused.stderr


def test_translate_names_a_missing_model(tmp_path):
    for flag in ("--model", "--model_dir"):
        result = run_command("tft-translate", flag, str(tmp_path / "nothing"), input="zeta\n", timeout=120)
        assert result.returncode != 0 and flag in result.stderr and "Traceback" not in result.stderr


def test_translate_refuses_an_early_stop_rule_for_an_export(tmp_path):
    """An export fixed its rule when it was written, and sampling has none: --early_stop there is refused, not
    ignored."""
    result = run_command(
        "tft-translate", "--model", str(tmp_path / "export"), "--early_stop", "exact", input="zeta\n", timeout=120
    )
    assert result.returncode != 0 and "--early_stop is fixed when exporting" in result.stderr
    sampled = run_command(
        "tft-translate", "--model_dir", str(tmp_path / "run"), "--sampling", "--early_stop", "exact", input="zeta\n"
    )
    assert sampled.returncode != 0 and "--early_stop is beam search's" in sampled.stderr


def test_a_run_directory_or_export_of_another_format_is_a_usage_error_naming_both(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"format": 1, "model": {}, "run": {}}')  # written before RUN_FORMAT 2
    export = tmp_path / "export" / "1"
    (export / "assets.extra").mkdir(parents=True)
    (export / "saved_model.pb").write_bytes(b"")
    (export / "assets.extra" / "tf_transformer.json").write_text('{"format": 2}')
    for flag, path, says in (
        ("--model_dir", run, f"{run / 'config.json'}: run directory format 1, this tf_transformer reads format 2"),
        ("--model", export, "tf_transformer.json: export format 2, this tf_transformer reads format 1"),
    ):
        result = run_command("tft-translate", flag, str(path), input="zeta\n")
        assert result.returncode == 1 and says in result.stderr, result.stderr[-3000:]
        assert "Traceback" not in result.stderr

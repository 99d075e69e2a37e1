"""tft-score, and tft-translate's target prefixes and sampling, from an export and from a run."""

import numpy as np
import pytest

from tests.commands import run_command

LINES = ["zeta", "alpha beta gamma", "omega sigma"]


def columns(result) -> list[list[str]]:
    assert result.returncode == 0, result.stderr[-3000:]
    return [line.split("\t") for line in result.stdout.rstrip("\n").split("\n")]


def test_scoring_the_translations_gives_their_scores(tiny_run, tiny_export, tmp_path):
    """tft-translate --scores with an export, then tft-score of its output with the run: the same scores."""
    source = tmp_path / "src.txt"
    source.write_text("\n".join(LINES) + "\n")
    translated = columns(run_command("tft-translate", "--model", tiny_export, "--scores", input=source.read_text()))
    target = tmp_path / "tgt.txt"
    target.write_text("\n".join(text for _, text in translated) + "\n")
    # From the run (the export's score signature answers the same: tests/serving/test_request_time.py).
    from_run = columns(
        run_command("tft-score", "--model_dir", tiny_run, "--src", source, "--tgt", target, "--token_scores")
    )
    np.testing.assert_allclose([float(row[0]) for row in from_run], [float(s) for s, _ in translated], atol=2e-3)
    for row in from_run:  # the tokens' log-probabilities sum to the total; one per token, EOS counted
        tokens = [float(value) for value in row[3].split()]
        assert len(tokens) == int(row[2]) and sum(tokens) == pytest.approx(float(row[1]), abs=2e-3)


def test_score_refuses_misaligned_files(tiny_export, tmp_path):
    (tmp_path / "src.txt").write_text("a\nb\n")
    (tmp_path / "tgt.txt").write_text("a\n")
    result = run_command(
        "tft-score", "--model", tiny_export, "--src", tmp_path / "src.txt", "--tgt", tmp_path / "tgt.txt"
    )
    assert result.returncode != 0 and "tgt.txt" in result.stderr and "Traceback" not in result.stderr


def test_target_prefixes_from_a_run(tiny_run, tmp_path):
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("Katze\n\nsigma sig\n")
    flags = ["--target_prefix", prefixes, "--max_extra_length", "10"]
    # From the run; the export's signature gives the same (tests/inference/test_request_options.py).
    from_run = run_command("tft-translate", "--model_dir", tiny_run, *flags, input="\n".join(LINES) + "\n")
    assert from_run.returncode == 0, from_run.stderr[-3000:]
    outputs = from_run.stdout.split("\n")[:3]
    assert outputs[0].startswith("Katze") and outputs[2].startswith("sigma sig")


def test_prefix_files_must_have_a_line_per_input_line(tmp_path):
    from pipelines import DataError
    from tf_transformer.inference.batch_translation import with_prefixes

    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("Katze\n\n")
    assert list(with_prefixes(iter(["a", "b"]), str(prefixes))) == [("a", "Katze"), ("b", "")]
    with pytest.raises(DataError, match="prefixes.txt has more lines than the input"):
        list(with_prefixes(iter(["a"]), str(prefixes)))
    with pytest.raises(DataError, match="prefixes.txt has 2 lines, fewer than the input"):
        list(with_prefixes(iter(["a", "b", "c"]), str(prefixes)))


# Two tft-translate processes, one loading an export, one a run.
@pytest.mark.slow
def test_sampling_from_an_export_and_a_run(tiny_run, tiny_export):
    """The same seed draws the same from an export and a run (other seeds: tests/inference/test_request_options.py)."""
    flags = ["--sampling", "--seed", "4", "--top_p", "0.9", "--scores", "--max_extra_length", "10"]
    text = "\n".join(LINES) + "\n"
    from_export = columns(run_command("tft-translate", "--model", tiny_export, *flags, input=text))
    from_run = columns(run_command("tft-translate", "--model_dir", tiny_run, *flags, input=text))
    assert [t for _, t in from_export] == [t for _, t in from_run]
    np.testing.assert_allclose([float(s) for s, _ in from_export], [float(s) for s, _ in from_run], atol=2e-3)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--top_k", "5"], "need --sampling"),
        (["--sampling", "--nbest", "2"], "--sampling draws one output per line"),
        (["--sampling", "--temperature", "0"], "temperature must be positive"),
        (["--alignment", "--beam_size", "2"], "--alignment comes from"),
        (["--checkpoint", "best"], "--checkpoint needs --model_dir"),
    ],
)
def test_translate_refuses_flags_that_do_not_go_together(tiny_export, flags, message):
    result = run_command("tft-translate", "--model", tiny_export, *flags, input="zeta\n", timeout=120)
    assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr


def test_a_run_without_a_best_checkpoint_is_named(tiny_run, tmp_path):
    (tmp_path / "line.txt").write_text("zeta\n")
    for command in ("tft-translate", "tft-score"):
        flags = [] if command == "tft-translate" else ["--src", tmp_path / "line.txt", "--tgt", tmp_path / "line.txt"]
        result = run_command(command, "--model_dir", tiny_run, "--checkpoint", "best", *flags, input="zeta\n")
        assert result.returncode != 0 and "no best checkpoint" in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr

"""tft-evaluate: sacreBLEU and chrF through an export; mismatched files named."""

import json
import subprocess

from tests.commands import BIN


def test_evaluate_cli_scores_with_sacrebleu(tmp_path, tiny_export):
    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_text("zeta\nalpha beta\nomega\n")
    ref.write_text("Zeta.\nAlpha beta.\nOmega.\n")
    hyp = tmp_path / "out" / "hyp.de"
    result = subprocess.run(
        [str(BIN / "tft-evaluate"), "--model", str(tiny_export), "--src", str(src), "--ref", str(ref)]
        + ["--output", str(hyp)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(scores) >= {"bleu", "chrf", "signature", "sentences", "lc_tok_bleu", "length_ratio", "moses_bleu"}
    assert scores["moses_language"] == "de"  # the suffix of --ref
    assert "Moses-tokenized BLEU" in result.stderr
    assert scores["sentences"] == 3 and "nrefs:1" in scores["signature"] and "case:mixed" in scores["signature"]
    assert len(hyp.read_text().splitlines()) == 3
    unnamed = tmp_path / "reference.txt"
    unnamed.write_text(ref.read_text())
    for extra, language in (([], None), (["--tgt", "fr"], "fr")):
        run = subprocess.run(
            [str(BIN / "tft-evaluate"), "--model", str(tiny_export), "--src", str(src), "--ref", str(unnamed), *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.strip().splitlines()[-1]).get("moses_language") == language
        assert ("reference.txt names no language, pass --tgt" in run.stderr) == (language is None)
    ref.write_text("Zeta.\n")
    bad = subprocess.run(
        [str(BIN / "tft-evaluate"), "--model", str(tiny_export), "--src", str(src), "--ref", str(ref)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode != 0 and "test.en has 3 lines" in bad.stderr

"""``tft-export --format ctranslate2``: flags of the other format refused, an existing output kept, a missing
package named. None of these needs ctranslate2 (tests/exporting/test_ctranslate2_export.py exports with it)."""

import subprocess
import sys

import pytest

from tests.commands import run_command
from tf_transformer.exporting.ctranslate2 import QUANTIZATIONS, export_ctranslate2, import_ctranslate2


def test_flags_of_the_other_format_are_refused(tmp_path):
    quantized = run_command(
        "tft-export", "--model_dir", tmp_path, "--output", tmp_path / "out", "--quantization", "int8"
    )
    assert quantized.returncode != 0
    assert "--quantization: not with --format saved_model" in quantized.stderr
    beam = run_command(
        "tft-export", "--model_dir", tmp_path, "--output", tmp_path / "out", "--format", "ctranslate2",
        "--beam_size", "3", "--noalignment",
    )  # fmt: skip
    assert beam.returncode != 0
    assert "--beam_size, --alignment: not with --format ctranslate2" in beam.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_output_is_refused(tiny_run, tmp_path):
    output = tmp_path / "ct2"
    output.mkdir()
    (output / "mine.txt").write_text("kept")
    result = run_command("tft-export", "--model_dir", tiny_run, "--output", output, "--format", "ctranslate2")
    assert result.returncode != 0
    assert f"{output} exists" in result.stderr and "--overwrite" in result.stderr
    assert [path.name for path in output.iterdir()] == ["mine.txt"]
    with pytest.raises(FileExistsError, match="exists"):
        export_ctranslate2(str(tiny_run), str(output))


def test_an_unknown_quantization_is_refused(tiny_run, tmp_path):
    with pytest.raises(ValueError, match="int8, int8_float32"):
        export_ctranslate2(str(tiny_run), str(tmp_path / "ct2"), quantization="int4")
    assert not (tmp_path / "ct2").exists()


def test_a_missing_ctranslate2_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # what a failed import of it raises
    with pytest.raises(ImportError, match=r"ctranslate2 package.*pip install -e '\.\[reference\]'"):
        import_ctranslate2()


def test_the_quantization_flag_offers_what_the_export_takes():
    script = (
        "from absl import flags; import tf_transformer.cli.export; "
        "print(' '.join(flags.FLAGS['quantization'].parser.enum_values))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert tuple(result.stdout.split()) == QUANTIZATIONS

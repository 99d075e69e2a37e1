"""What an export records: written and read back with its format, another format refused, read without Keras."""

import json
import re
import subprocess
import sys

import pytest

from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.exporting.export_info import (
    EXPORT_FORMAT,
    EXPORT_INFO,
    ExportInfo,
    read_export_info,
    write_export_info,
)
from tf_transformer.formats import FormatError


def test_written_and_read_back(tmp_path):
    info = ExportInfo(
        signatures=("serving_default", "translate_ids"),
        serving_default="translate_ids",
        source_vocab_size=300,
        dtype="bfloat16",
        options=DecodeOptions(max_extra_length=10, max_output_length=30, max_source_length=64),
    )
    write_export_info(str(tmp_path), info)
    written = json.loads((tmp_path / EXPORT_INFO).read_text(encoding="utf-8"))
    assert written["format"] == EXPORT_FORMAT == 1
    assert written["max_extra_length"] == 10 and written["max_output_length"] == 30 and written["batch_parts"] == 1
    assert read_export_info(str(tmp_path)) == info


def test_an_export_of_another_format_or_none_is_refused_naming_both(tmp_path):
    export = tmp_path / "models" / "x" / "1"
    write_export_info(str(export), ExportInfo(signatures=("serving_default",), options=DecodeOptions()))
    path = export / EXPORT_INFO
    written = json.loads(path.read_text(encoding="utf-8"))
    for recorded, named in ((0, "format 0"), (EXPORT_FORMAT + 1, "format 2"), (None, "format none")):
        changed = {key: value for key, value in written.items() if key != "format"}
        if recorded is not None:
            changed["format"] = recorded
        path.write_text(json.dumps(changed), encoding="utf-8")
        expected = re.escape(f"{path}: export {named}") + ".*, this tf_transformer reads format 1; export the run again"
        with pytest.raises(FormatError, match=expected):
            read_export_info(str(export))
    path.unlink()
    with pytest.raises(FormatError, match=re.escape(f"{path} not found") + ".*reads export format 1"):
        read_export_info(str(export))


def test_the_server_reads_exports_without_keras_or_the_model():
    """The server's modules, and the reading of an export, import neither Keras nor the model."""
    script = (
        "import sys, json; import tf_transformer.exporting.export_info, tf_transformer.serving, "
        "tf_transformer.serving.http_server, tf_transformer.serving.servable; "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'keras' or m.startswith(('keras.', "
        "'tf_transformer.model', 'tf_transformer.layers'))))) "
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == []


def test_a_parser_export_records_its_closings_and_its_task_writes_gold_trees_so(tmp_path):
    from nltk import Tree

    from tf_transformer.cli import model_task

    tree = Tree.fromstring("(S (NP (NNP John)) (VP (VBD ran)))")
    for closings, written in ((None, "(S (NP John )NP (VP ran )VP )S"), ("bare", "(S (NP John ) (VP ran ) )")):
        info = ExportInfo(task="parsing", linearization="words", closings=closings)
        assert ExportInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info
        export = tmp_path / (closings or "labeled")
        write_export_info(str(export), info)
        assert model_task(str(export), None).target_text(tree) == written  # tft-score's gold trees: as trained

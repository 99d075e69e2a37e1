"""What an export records: written and read back, read from earlier versions' files, read without Keras."""

import json
import subprocess
import sys

from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.exporting.export_info import EXPORT_INFO, ExportInfo, read_export_info, write_export_info

# assets.extra/tf_transformer.json as tft-export wrote it before the options took today's names.
EARLIER = {
    "signatures": ["serving_default", "translate_ids", "translate_with_alignment"],
    "alignment_layer": 1,
    "serving_default": "translate",
    "max_source_length": 64,
    "truncate_source": False,
    "source_vocab_size": 120,
    "beam_size": 4,
    "alpha": 0.6,
    "extra_length": 10,
    "min_length": 40,
    "max_length": 40,
    "streams": 2,
    "dtype": "float32",
}


def test_an_earlier_versions_file_is_read_under_todays_names(tmp_path):
    (tmp_path / "assets.extra").mkdir()
    (tmp_path / EXPORT_INFO).write_text(json.dumps(EARLIER), encoding="utf-8")
    info = read_export_info(str(tmp_path))
    assert info.options == DecodeOptions(
        beam_size=4,
        alpha=0.6,
        max_extra_length=10,
        min_length=40,
        max_output_length=40,
        batch_parts=2,
        max_source_length=64,
        early_stop="exact",  # what searches of earlier versions stopped on
    )
    assert info.signatures == ("serving_default", "translate_ids", "translate_with_alignment")
    assert (info.alignment_layer, info.source_vocab_size, info.dtype) == (1, 120, "float32")


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
    assert written["max_extra_length"] == 10 and written["max_output_length"] == 30 and written["batch_parts"] == 1
    assert not {"extra_length", "max_length", "streams"} & set(written)
    assert read_export_info(str(tmp_path)) == info


def test_an_export_without_the_file_records_nothing(tmp_path):
    assert read_export_info(str(tmp_path)) == ExportInfo() and ExportInfo().options is None
    assert ExportInfo.from_dict({"signatures": ["serving_default"]}).options is None  # no setting is guessed


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


def test_settings_the_flags_now_refuse_still_load_from_an_earlier_export():
    """Earlier tft-export bounded neither --alpha nor --max_extra_length: what such an export recorded is read."""
    info = ExportInfo.from_dict({"signatures": ["serving_default"], "beam_size": 4, "alpha": -0.2, "min_length": 0})
    assert info.options == DecodeOptions(beam_size=4, alpha=-0.2, min_length=0, early_stop="exact")


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

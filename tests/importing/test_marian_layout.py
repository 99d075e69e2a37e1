"""An OPUS-MT model in Marian's own layout (decoder.yml, .npz, .vocab.yml) imports as the same model as in
Hugging Face's: the same weights and vocabulary, Marian's layer-norm ε, the same greedy output as transformers."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.importing.marian_layout import MODEL_FILE, VOCAB_FILE, write_marian_directory
from tests.importing.test_marian import FIXTURE, _ours, _pad_id
from tf_transformer.constants import PAD_ID
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.importing.imported_run import import_opus_mt
from tf_transformer.importing.marian import ModelImportError
from tf_transformer.importing.vocabulary import VocabularyError, read_vocab_yml
from tf_transformer.run_dir import RUN_FORMAT, restore_model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(hugging_face_run, marian_run)``: the fixture imported from each layout."""
    root = tmp_path_factory.mktemp("layouts")
    marian = write_marian_directory(root / "opus-mt-marian")
    import_opus_mt(str(FIXTURE), str(root / "from_hugging_face"))
    import_opus_mt(str(marian), str(root / "from_marian"))
    return root / "from_hugging_face", root / "from_marian"


def test_both_layouts_give_the_same_weights_and_vocabulary(runs):
    from_hf, from_marian = runs
    (hf_model, hf_config), (marian_model, marian_config) = restore_model(str(from_hf)), restore_model(str(from_marian))
    hf_weights = {w.path.split("/", 1)[1]: w.numpy() for w in hf_model.weights}
    marian_weights = {w.path.split("/", 1)[1]: w.numpy() for w in marian_model.weights}
    assert hf_weights.keys() == marian_weights.keys()
    assert marian_weights["shared_embedding/logits_bias"][PAD_ID] == -100.0  # no entry of Marian's softmax
    for path, value in hf_weights.items():
        np.testing.assert_array_equal(marian_weights[path], value, err_msg=path)
    for name in ("sp.model", "sp.target.model"):
        assert (from_marian / name).read_bytes() == (from_hf / name).read_bytes(), name
    differ = {k for k, v in marian_config.to_dict().items() if hf_config.to_dict()[k] != v}
    assert differ == {"layer_norm_epsilon", "beam_size", "max_positions", "max_train_length"}
    assert marian_config.layer_norm_epsilon == 1e-6  # Marian's (src/layers/generic.h); the port's torch uses 1e-5
    assert marian_config.beam_size == 6  # decoder.yml's beam-size
    stored = json.loads((from_marian / "config.json").read_text())
    assert stored["format"] == RUN_FORMAT and stored["imported"]["format"] == "marian"  # ours, and the source's


def test_greedy_output_equals_hugging_face_s_generate(runs):
    """The reference's greedy steps are far from ties (``tests/importing/marian_reference.py``), so Marian's ε
    does not change them."""
    reference = dict(np.load(FIXTURE / "reference.npz"))
    model, _ = restore_model(str(runs[1]))
    from tf_transformer.tasks import run_tokenizer

    processor = run_tokenizer(str(runs[1])).python_processor()
    vocab = json.loads((FIXTURE / "vocab.json").read_text(encoding="utf-8"))
    ours = np.array([processor.piece_to_id(p) for p, _ in sorted(vocab.items(), key=lambda item: item[1])])
    pad = _pad_id(reference)
    length = reference["greedy"].shape[1] - 1
    ids = greedy_search(
        model, tf.constant(_ours(reference["input_ids"], ours, pad)), max_output_length=length, min_length=0
    )
    ids = np.pad(ids.numpy(), [[0, 0], [0, length - ids.shape[1]]])
    np.testing.assert_array_equal(ids, _ours(reference["greedy"][:, 1:], ours, pad))


@pytest.mark.parametrize(
    "options, named",
    [
        ({"transformer-preprocess": "n", "transformer-postprocess": "da"}, "pre-norm"),
        ({"transformer-postprocess-emb": "dn"}, "layer-normalized embeddings"),
        ({"transformer-decoder-autoreg": "average-attention"}, "transformer-decoder-autoreg"),
        ({"transformer-train-position-embeddings": True}, "learned positions"),
        ({"right-left": True}, "right-to-left"),
        ({"tied-embeddings-all": False}, "tied-embeddings-all"),
        ({"type": "s2s"}, "--type s2s"),
        ({"dec-depth": 3}, "--dec-depth 3"),
        ({"transformer-ffn-activation": "tanh"}, "tanh"),
        ({"transformer-ffn-activation": "gelu"}, "before v1.12.3 Marian computed"),  # the fixture: v1.7.6
        ({"transformer-disable-position-embeddings": True}, "disable-position-embeddings"),
        ({"transformer-attention-mask": "alibi"}, "attention-mask alibi"),
    ],
)
def test_unsupported_marian_options_are_refused_by_name_and_nothing_is_written(tmp_path, options, named):
    source = write_marian_directory(tmp_path / "opus", options=options)
    with pytest.raises(ModelImportError, match=named) as raised:
        import_opus_mt(str(source), str(tmp_path / "run"))
    assert MODEL_FILE in str(raised.value)  # names the file whose options say it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opus"]


def test_unknown_weights_ensembles_and_separate_vocabularies_are_refused(tmp_path):
    extra = write_marian_directory(tmp_path / "extra", extra_weights={"encoder_emb_ln_scale_pre": np.ones((1, 8))})
    with pytest.raises(ModelImportError, match="does not know: .'encoder_emb_ln_scale_pre'"):
        import_opus_mt(str(extra), str(tmp_path / "run"))
    ensemble = write_marian_directory(tmp_path / "ensemble")
    decoder = (ensemble / "decoder.yml").read_text().replace(f"- {MODEL_FILE}", f"- {MODEL_FILE}\n- {MODEL_FILE}")
    (ensemble / "decoder.yml").write_text(decoder)
    with pytest.raises(ModelImportError, match="ensemble of 2 models"):
        import_opus_mt(str(ensemble), str(tmp_path / "run"))
    separate = write_marian_directory(tmp_path / "separate")
    (separate / "target.vocab.yml").write_bytes((separate / VOCAB_FILE).read_bytes())
    decoder = (separate / "decoder.yml").read_text()
    (separate / "decoder.yml").write_text(decoder[::-1].replace(VOCAB_FILE[::-1], "target.vocab.yml"[::-1], 1)[::-1])
    with pytest.raises(ModelImportError, match="separate source and target vocabularies"):
        import_opus_mt(str(separate), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_directory_of_neither_layout_is_refused_with_what_was_expected(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelImportError, match="neither Hugging Face's layout .* nor Marian's"):
        import_opus_mt(str(tmp_path / "empty"), str(tmp_path / "run"))
    without_decoder = write_marian_directory(tmp_path / "bare")
    (without_decoder / "decoder.yml").unlink()
    import_opus_mt(str(without_decoder), str(tmp_path / "run"))  # one .npz and one *vocab.yml suffice
    (without_decoder / "second.npz").write_bytes((without_decoder / MODEL_FILE).read_bytes())
    with pytest.raises(ModelImportError, match="expected one model .npz"):
        import_opus_mt(str(without_decoder), str(tmp_path / "run2"))


def test_marian_vocabularies_read_quoted_pieces_line_by_line(tmp_path):
    path = tmp_path / "vocab.yml"
    lines = ["</s>: 0", "<unk>: 1", '"\\"": 2', "'''': 3", '"<<": 4', '"null": 5', "▁der: 6", '"\\u00a0": 7', ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    assert read_vocab_yml(str(path)) == {
        "</s>": 0,
        "<unk>": 1,
        '"': 2,
        "'": 3,
        "<<": 4,
        "null": 5,
        "▁der": 6,
        "\u00a0": 7,
    }
    path.write_text("</s>: 0\n<unk>: 1\n</s>: 2\n", encoding="utf-8")
    with pytest.raises(VocabularyError, match="line 3: the piece '</s>' is there twice"):
        read_vocab_yml(str(path))
    path.write_text("</s>: 0\n: 1\n", encoding="utf-8")  # no piece
    with pytest.raises(VocabularyError, match="line 2: expected 'piece: id'"):
        read_vocab_yml(str(path))
    path.write_text("</s>: 0\n<unk> 1\n", encoding="utf-8")
    with pytest.raises(VocabularyError, match="line 2: expected 'piece: id'"):
        read_vocab_yml(str(path))
    path.write_text("</s>: 0\n<unk>: 2\n", encoding="utf-8")
    with pytest.raises(VocabularyError, match="not 0 … 1"):
        read_vocab_yml(str(path))


def test_a_cut_model_file_is_refused_with_its_name(tmp_path):
    source = write_marian_directory(tmp_path / "opus")
    data = (source / MODEL_FILE).read_bytes()
    (source / MODEL_FILE).write_bytes(data[: len(data) // 2])  # a download stopped halfway
    with pytest.raises(ModelImportError, match=f"{MODEL_FILE}: cannot read it as a Marian model"):
        import_opus_mt(str(source), str(tmp_path / "run"))


def test_a_release_without_its_sentencepiece_models_is_refused(tmp_path):
    source = write_marian_directory(tmp_path / "opus")
    (source / "target.spm").unlink()
    with pytest.raises(ModelImportError, match="target.spm not found: Marian's layout needs"):
        import_opus_mt(str(source), str(tmp_path / "run"))


def test_a_release_zip_imports_as_its_directory_and_errors_name_the_member(tmp_path, runs):
    import zipfile

    release = write_marian_directory(tmp_path / "opus-2020-02-26")
    archive = tmp_path / "opus-2020-02-26.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for path in release.iterdir():
            handle.write(path, path.name)
    import_opus_mt(str(archive), str(tmp_path / "run"))
    for name in ("sp.model", "sp.target.model"):
        assert (tmp_path / "run" / name).read_bytes() == (runs[1] / name).read_bytes()
    imported = json.loads((tmp_path / "run" / "config.json").read_text())["imported"]
    assert imported == {"from": str(archive), "format": "marian"}

    nested = tmp_path / "nested.zip"  # a zip of the folder, not of its files
    with zipfile.ZipFile(nested, "w") as handle:
        for path in release.iterdir():
            if path.name != "target.spm":
                handle.write(path, f"opus/{path.name}")
    with pytest.raises(ModelImportError, match=f"^{re.escape(str(nested))}:opus/target.spm not found"):
        import_opus_mt(str(nested), str(tmp_path / "run2"))
    unrelated = tmp_path / "unrelated.zip"  # files at the top, of neither layout: the zip is named, not /tmp
    with zipfile.ZipFile(unrelated, "w") as handle:
        handle.writestr("README.md", "a model card")
    with pytest.raises(ModelImportError, match=f"^{re.escape(str(unrelated))} holds neither") as raised:
        import_opus_mt(str(unrelated), str(tmp_path / "run4"))
    assert "tft-import-" not in str(raised.value)
    (tmp_path / "not.zip").write_text("text")
    with pytest.raises(ModelImportError, match="neither a directory nor a zip file"):
        import_opus_mt(str(tmp_path / "not.zip"), str(tmp_path / "run3"))

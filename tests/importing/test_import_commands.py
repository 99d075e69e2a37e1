"""From an OPUS-MT directory to a served and a fine-tuned model with the commands a user runs
(docs/importing.md), and the committed reference is what transformers computes (slow: needs the
"reference" extra)."""

import json

import numpy as np
import pytest

from tests.commands import export_cli, run_command
from tests.corpora import write_corpus
from tests.importing.test_marian import FIXTURE
from tests.serving.client import Server

SOURCES = ["alpha beta gamma", "haus baum katze hund delta", "omega", "sigma zeta theta kappa lambda epsilon"]
TARGETS = ["Alpha beta.", "Haus baum katze.", "Omega omega omega omega.", "Sigma."]


@pytest.mark.slow
def test_import_export_translate_and_serve(tmp_path):
    run = tmp_path / "opus_mt"
    done = run_command("tft-import", "--source", FIXTURE, "--model_dir", run)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["model"]["position_timescales"] == "tensor2tensor" and summary["model"]["num_layers"] == 2
    again = run_command("tft-import", "--source", FIXTURE, "--model_dir", run)
    assert again.returncode != 0 and "exists" in again.stderr  # an existing run is never overwritten silently

    export = export_cli(run, tmp_path / "serving" / "opus_mt" / "1")
    assert (export / "assets" / "sp.target.model").exists()
    lines = "\n".join(SOURCES) + "\n"
    from_run = run_command("tft-translate", "--model_dir", run, "--max_extra_length", "10", input=lines)
    from_export = run_command("tft-translate", "--model", export, input=lines)
    assert from_run.returncode == 0 and from_export.returncode == 0, (
        from_run.stderr[-2000:],
        from_export.stderr[-2000:],
    )
    translations = from_export.stdout.splitlines()
    assert translations == from_run.stdout.splitlines() and len(translations) == len(SOURCES)

    (tmp_path / "src.txt").write_text(lines, encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(translations) + "\n", encoding="utf-8")
    scored = run_command(
        "tft-evaluate", "--model", export, "--src", tmp_path / "src.txt", "--ref", tmp_path / "ref.txt"
    )
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads(scored.stdout.strip().splitlines()[-1])["bleu"] == 100.0  # its own output as the reference
    drawn = run_command("tft-attention", "--model_dir", run, "--sentence", SOURCES[0], "--output", tmp_path / "figures")
    assert drawn.returncode == 0 and list((tmp_path / "figures").rglob("*.png")), drawn.stderr[-3000:]

    corpus = tmp_path / "corpus"
    write_corpus(corpus, n=60)
    tuned = tmp_path / "tuned"
    flags = ["--data", corpus, "--model_dir", tuned, "--train_steps", "2", "--tokens_per_batch", "256"]
    done = run_command("tft-train", "--init_from", run, *flags, "--dev_split", "", "--checkpoint_every", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    stored, source = (json.loads((r / "config.json").read_text())["model"] for r in (tuned, run))
    assert (stored.pop("train_steps"), stored.pop("tokens_per_batch")) == (2, 256)  # the flags set the config
    assert stored == {name: value for name, value in source.items() if name not in ("train_steps", "tokens_per_batch")}
    # The imported model, with its vocabulary: both SentencePiece models.
    for name in ("sp.model", "sp.target.model"):
        assert (tuned / name).read_bytes() == (run / name).read_bytes(), name

    server = Server(export.parent)
    try:
        status, body = server.post({"instances": SOURCES})
    finally:
        server.stop()
    assert status == 200, body
    assert [p["translations"] for p in body["predictions"]] == translations


@pytest.mark.slow
def test_the_committed_reference_is_what_transformers_computes(tmp_path):
    pytest.importorskip(
        "transformers", reason="the reference needs transformers and torch: pip install -e '.[reference]'"
    )
    from tests.importing.marian_reference import write

    write(tmp_path)
    for name in ("config.json", "vocab.json", "source.spm", "target.spm"):
        assert (tmp_path / name).read_bytes() == (FIXTURE / name).read_bytes(), name
    ours, theirs = np.load(FIXTURE / "reference.npz"), np.load(tmp_path / "reference.npz")
    assert set(ours.files) == set(theirs.files)
    for key in ours.files:
        if ours[key].dtype.kind == "f":
            np.testing.assert_allclose(theirs[key], ours[key], atol=1e-5, err_msg=key)
        else:
            np.testing.assert_array_equal(theirs[key], ours[key], err_msg=key)
    from safetensors.numpy import load_file

    weights, committed = load_file(tmp_path / "model.safetensors"), load_file(FIXTURE / "model.safetensors")
    assert weights.keys() == committed.keys()
    for name in weights:
        np.testing.assert_array_equal(weights[name], committed[name], err_msg=name)


@pytest.mark.slow
def test_marian_s_layout_translates_as_ctranslate2_s_own_marian_converter(tmp_path):
    """An OPUS-MT release as Marian writes it, imported with ``tft-import``, gives CTranslate2's greedy output
    from the same files (its converter reads Marian's names itself; it builds Hugging Face's position table,
    hence ``--position_timescales paper``)."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="needs ctranslate2: pip install -e '.[reference]'")
    import sentencepiece as spm
    import tensorflow as tf

    from tests.importing.marian_layout import MODEL_FILE, VOCAB_FILE, write_marian_directory
    from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
    from tf_transformer.decoding.greedy import greedy_search
    from tf_transformer.run_dir import restore_model
    from tf_transformer.tasks import run_tokenizer

    source = write_marian_directory(tmp_path / "opus-mt-release")
    run = tmp_path / "run"
    done = run_command("tft-import", "--source", source, "--model_dir", run, "--position_timescales", "paper")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["imported"]["format"] == "marian"

    converter = ctranslate2.converters.MarianConverter(str(source / MODEL_FILE), [str(source / VOCAB_FILE)] * 2)
    translator = ctranslate2.Translator(converter.convert(str(tmp_path / "ct2")), device="cpu")
    segmenter = spm.SentencePieceProcessor(model_file=str(source / "source.spm"))
    limit = 12  # the random model repeats a piece on some sentences: both stop there
    batch = [segmenter.encode(s, out_type=str) for s in SOURCES]
    results = translator.translate_batch(batch, beam_size=1, max_decoding_length=limit)
    theirs = [result.hypotheses[0] for result in results]

    model, _ = restore_model(str(run))
    tokenizer = run_tokenizer(str(run))
    tokens = tokenizer.tokenize(tf.constant(SOURCES))
    inputs = tf.concat([tokens, tf.fill([tokens.nrows(), 1], EOS_ID)], axis=1).to_tensor()  # Marian's source EOS
    ids = greedy_search(model, inputs, max_output_length=limit + 1, min_length=0).numpy()  # ours counts EOS
    pieces = tokenizer.python_processor()
    ours = [[pieces.id_to_piece(int(i)) for i in row if i not in (EOS_ID, PAD_ID)] for row in ids]
    assert ours == theirs

    # Every logit, not only the argmax: teacher-forced log-probabilities of real target sentences.
    targets = [
        spm.SentencePieceProcessor(model_file=str(source / "target.spm")).encode(t, out_type=str) for t in TARGETS
    ]
    scored = translator.score_batch(batch, targets)
    target_ids = [[pieces.piece_to_id(p) for p in row] for row in targets]
    length = max(map(len, target_ids)) + 1
    decoder_inputs = [[BOS_ID, *row] + [PAD_ID] * (length - len(row) - 1) for row in target_ids]
    logits = model({"inputs": inputs, "targets": tf.constant(decoder_inputs)}, training=False)
    log_probs = tf.nn.log_softmax(logits, axis=-1).numpy()  # [batch, length, vocab]
    for row, (ids_, result) in enumerate(zip(target_ids, scored, strict=True)):
        expected = [log_probs[row, step, token] for step, token in enumerate([*ids_, EOS_ID])]
        np.testing.assert_allclose(result.log_probs, expected, atol=1e-4, err_msg=TARGETS[row])
    assert sum(map(len, ours)) > len(ours)  # outputs of several pieces, not only EOS


@pytest.mark.slow
def test_language_codes_tokenize_as_transformers_marian_tokenizer(tmp_path):
    pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[reference]'")
    import tensorflow as tf
    from transformers import MarianTokenizer

    from tests.importing.marian_layout import write_multilingual_directory
    from tests.importing.test_language_codes import SOURCES as CODED
    from tf_transformer.constants import EOS_ID, UNK_ID
    from tf_transformer.importing.imported_run import import_opus_mt
    from tf_transformer.tasks import run_tokenizer

    source = write_multilingual_directory(tmp_path / "opus-mt-en-mul")
    import_opus_mt(str(source), str(tmp_path / "run"))
    tokenizer = run_tokenizer(str(tmp_path / "run"))
    theirs = MarianTokenizer(str(source / "source.spm"), str(source / "target.spm"), str(source / "vocab.json"))
    assert set(theirs.supported_language_codes) == {">>deu<<", ">>fra<<"}
    processor = tokenizer.python_processor()
    ours_of = {i: processor.piece_to_id(piece) for piece, i in theirs.encoder.items()}
    ours_of[theirs.unk_token_id] = UNK_ID
    texts = list(CODED)
    rows = tokenizer.tokenize(tf.constant(texts)).to_list()
    for text, row in zip(texts, rows, strict=True):
        assert [*row, EOS_ID] == [ours_of[i] for i in theirs(text)["input_ids"]], text

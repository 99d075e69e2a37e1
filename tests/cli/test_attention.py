"""tft-attention: every layer and the paper-style figures from a run, the export's one layer, flags checked."""

import json

import pytest
from matplotlib.image import imread

from tests.commands import run_command

KINDS = ("encoder", "decoder", "cross")


def attention_cli(*flags):
    return run_command("tft-attention", *flags)


# A tft-attention process drawing every figure.
@pytest.mark.slow
def test_a_run_gets_every_layer_and_the_paper_figures(tiny_run, tmp_path):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("alpha beta gamma delta\nzeta omega\n", encoding="utf-8")
    result = attention_cli("--model_dir", str(tiny_run), "--input", str(sentences), "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {"output": str(tmp_path / "out"), "sentences": 2}
    for number in (1, 2):
        directory = tmp_path / "out" / f"sentence_{number}"
        info = json.loads((directory / "attention.json").read_text(encoding="utf-8"))
        assert info["layer"] == 0  # the penultimate of tiny's 2 layers
        assert info["unit"] == "pieces" and info["source_tokens"][-1] == "</s>"
        expected = [f"{kind}_layer{layer}.png" for kind in KINDS for layer in (1, 2)]
        assert info["figures"] == [*expected, "figure3_layer1.png", "figure4_layer1.png"]
        assert sorted(path.name for path in directory.glob("*.png")) == sorted(info["figures"])
        for name in info["figures"]:
            assert imread(directory / name).shape[2] == 4  # a whole PNG, RGBA
        assert 0 <= info["token"] < len(info["source_tokens"]) - 1 and len(info["heads"]) == 2


@pytest.mark.slow
def test_words_token_and_heads_are_followed(tiny_run, tmp_path):
    output = tmp_path / "out"
    result = attention_cli(
        "--model_dir",
        str(tiny_run),
        "--sentence",
        "alpha beta gamma",
        "--output",
        str(output),
        "--words",
        "--layer",
        "1",
        "--token",
        "beta",
        "--heads",
        "3,1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((output / "sentence_1" / "attention.json").read_text(encoding="utf-8"))
    assert info["unit"] == "words" and info["source_tokens"] == ["alpha", "beta", "gamma", "</s>"]
    assert info["layer"] == 1 and info["token_text"] == "beta" and info["heads"] == [3, 1]
    assert "figure3_layer2.png" in info["figures"]


@pytest.mark.slow
def test_an_export_draws_its_alignment_layer(tiny_export, tmp_path):
    output = tmp_path / "out"
    result = attention_cli("--model", str(tiny_export), "--sentence", "alpha beta gamma", "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((output / "sentence_1" / "attention.json").read_text(encoding="utf-8"))
    assert info["layer"] == 1 and info["figures"] == ["cross_layer2_mean.png"]
    assert info["source_tokens"][-1] == "</s>" and info["target_tokens"][-1] == "</s>"
    pairs = [tuple(map(int, pair.split("-"))) for pair in info["alignment"].split()]
    assert all(0 <= source < 3 for source, _ in pairs)  # three source words
    assert imread(output / "sentence_1" / "cross_layer2_mean.png").ndim == 3
    # What is drawn is what the export's signature returns for the sentence.
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    signature = tf.saved_model.load(str(tiny_export)).signatures["translate_with_alignment"]
    outputs = signature(inputs=tf.constant(["alpha beta gamma"]))
    assert info["alignment"] == outputs["alignments"].numpy()[0].decode()
    assert info["translation"] == outputs["translations"].numpy()[0].decode()
    ids = outputs["ids"].numpy()[0]
    assert len(info["target_tokens"]) == int((ids != 0).sum())  # one row per piece of the translation, EOS included


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sentence", "a b", "--output", "{out}"], "exactly one of --model (an export) or --model_dir"),
        (["--model_dir", "{run}", "--output", "{out}"], "exactly one of --sentence or --input"),
        (["--model_dir", "{run}", "--sentence", "a b"], "--output DIR is required"),
        (["--model_dir", "{run}", "--sentence", "a b", "--output", "{out}", "--layer", "5"], "layers 0 to 1"),
        (["--model_dir", "{run}", "--sentence", "a b", "--output", "{out}", "--heads", "1"], "two head numbers"),
        (["--model", "{run}", "--sentence", "a b", "--output", "{out}"], "no saved_model.pb"),
        (["--model", "{run}", "--sentence", "a b", "--output", "{out}", "--layer", "1"], "need --model_dir"),
        pytest.param(  # found only once the sentence is translated
            ["--model_dir", "{run}", "--sentence", "a b", "--output", "{out}", "--token", "nowhere"],
            "not in the sentence",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_mistakes_are_named(tiny_run, tmp_path, flags, message):
    result = attention_cli(*(flag.format(run=tiny_run, out=tmp_path / "out") for flag in flags))
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "out").exists() or message == "not in the sentence"

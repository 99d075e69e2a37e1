"""Text edge cases read one way everywhere: CRLF, a lone \\r, a BOM, NUL bytes, no final newline, long lines.

Every reader (``ParallelText.pairs`` for vocabularies and dev BLEU, ``ParallelText.dataset`` for
training, ``read_test_set`` for ``tft-evaluate``) must see the same pairs, or they shift.
"""

import io
import logging
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipelines
from pipelines import DataError, parallel_files, read_lines, split_lines, tsv_file
from tf_transformer.bleu import read_test_set

BOM = b"\xef\xbb\xbf"


def tf_pairs(corpus):
    return [(s.decode("utf-8"), t.decode("utf-8")) for s, t in corpus.dataset().as_numpy_iterator()]


def files_pairs(source: Path, target: Path):
    """The pairs every reader of two line-aligned files sees, after checking that they all see the same ones."""
    files = parallel_files(str(source), str(target))
    pairs = list(files.pairs())
    assert len(pairs) == files.num_lines
    assert tf_pairs(files) == pairs
    sources, references = read_test_set(str(source), str(target))
    assert list(zip(sources, references, strict=True)) == pairs
    return pairs


def tsv_pairs(tsv: Path):
    """The same for a TSV file (``tft-evaluate`` reads two files only)."""
    table = tsv_file(str(tsv))
    pairs = list(table.pairs())
    assert tf_pairs(table) == pairs and table.num_lines == len(pairs)
    return pairs


def write(directory: Path, source: bytes, target: bytes, tsv: bytes):
    paths = directory / "x.en", directory / "x.de", directory / "x.tsv"
    for path, content in zip(paths, (source, target, tsv), strict=True):
        path.write_bytes(content)
    return paths


# Each case: the two files, the same pairs as one TSV file, and the pairs every reader must see.
CASES = {
    "crlf": (b"a b\r\nc\r\n", b"A B\r\nC\r\n", b"a b\tA B\r\nc\tC\r\n", [("a b", "A B"), ("c", "C")]),
    # tf.data's TextLineDataset drops every \r, so a \r inside a line is removed everywhere.
    "lone_cr": (b"a\rb\nc\n", b"A\nB\rC\n", b"a\rb\tA\nc\tB\rC\n", [("ab", "A"), ("c", "BC")]),
    "cr_before_crlf": (b"a\r\r\nb\n", b"A\nB\n", b"a\r\tA\r\r\nb\tB\n", [("a", "A"), ("b", "B")]),
    "bom": (BOM + b"a\nb\n", BOM + b"A\nB\n", BOM + b"a\tA\nb\tB\n", [("a", "A"), ("b", "B")]),
    "bom_only_at_file_start": (
        b"a\n" + BOM + b"b\n",
        b"A\nB\n",
        b"a\tA\n" + BOM + b"b\tB\n",
        [("a", "A"), ("\ufeffb", "B")],
    ),
    "no_final_newline": (b"a\nb", b"A\nB", b"a\tA\nb\tB", [("a", "A"), ("b", "B")]),
    "only_cr_after_last_newline": (b"a\n\r", b"A\n", b"a\tA\n\r", [("a", "A")]),
    "long_line": (b"x" * 300_000 + b"\nb\n", b"A\n" + b"y " * 100_000 + b"\n", None, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_reader_sees_the_same_pairs(tmp_path, case):
    source, target, tsv, expected = CASES[case]
    if expected is None:  # long lines: read whole by every reader
        expected = list(zip(source.decode().splitlines(), target.decode().splitlines(), strict=True))
        tsv = b"".join(s.encode() + b"\t" + t.encode() + b"\n" for s, t in expected)
    source_path, target_path, tsv_path = write(tmp_path, source, target, tsv)
    assert files_pairs(source_path, target_path) == expected
    assert tsv_pairs(tsv_path) == expected


@pytest.mark.parametrize(
    "content, lines",
    [
        (b"", []),
        (b"\n", [""]),
        (b"\r", []),
        (b"\r\n\r", [""]),
        (BOM, [""]),
        (BOM + b"\r\n", [""]),
        (b"\r" + BOM + b"a", ["a"]),
        (BOM + BOM + b"a\n", ["\ufeffa"]),
        ("ä\r€\n😀\u2028x\x85y\n".encode(), ["ä€", "😀\u2028x\x85y"]),
    ],
)
def test_python_and_tf_data_read_a_file_byte_for_byte_alike(tmp_path, content, lines):
    path = tmp_path / "lines.txt"
    path.write_bytes(content)
    assert list(read_lines(str(path))) == lines
    assert [line.decode("utf-8") for line in pipelines.line_dataset(str(path)).as_numpy_iterator()] == lines
    assert list(split_lines(io.BytesIO(content), "<stdin>")) == lines  # tft-translate's stdin


@pytest.mark.parametrize("form", ["files", "tsv"])
def test_nul_byte_names_file_and_line(tmp_path, form):
    source, target, tsv = write(tmp_path, b"a\nb\n", b"A\nB\x00\n", b"a\tA\nb\tB\x00\n")
    with pytest.raises(DataError, match=rf"x\.{'tsv' if form == 'tsv' else 'de'}:2: NUL byte"):
        parallel_files(str(source), str(target)) if form == "files" else tsv_file(str(tsv))
    with pytest.raises(DataError, match=r"x\.de:2: NUL byte"):
        read_test_set(str(source), str(target))


def test_utf16_text_is_rejected_naming_file_and_line(tmp_path):
    source, target, _ = write(tmp_path, b"a\n", "Haus\n".encode("utf-16-le"), b"")
    with pytest.raises(DataError, match=r"x\.de:1: NUL byte.*UTF-16"):
        parallel_files(str(source), str(target))


def test_vocabulary_counts_the_sentences_too_long_for_it(tmp_path, caplog):
    pairs = [("alpha beta gamma", "Haus Baum.")] * 40 + [("zq " * 2000, "kurz.")]
    with caplog.at_level(logging.WARNING):
        pipelines.train_sentencepiece(pairs, str(tmp_path / "sp.model"), vocab_size=40)
    assert "leaves out 1 of 82 sampled sentences longer than 4192 UTF-8 bytes" in caplog.text


# --- random corpora -------------------------------------------------------------------------------

# Letters, spaces and the characters that break readers: \r, a BOM, Unicode line separators.
TEXT = st.text(
    st.sampled_from(["a", "ß", " ", "\r", "\ufeff", "€", "😀", "\u2028", "\x85", "\x0b"])
    | st.characters(codec="utf-8", exclude_characters="\n\t\x00"),
    max_size=8,
)
PAIRS = st.lists(st.tuples(TEXT, TEXT), max_size=6)
LAYOUT = st.fixed_dictionaries(
    {"crlf": st.lists(st.booleans(), min_size=6, max_size=6), "bom": st.booleans(), "final_newline": st.booleans()}
)


def file_bytes(lines: list[str], layout) -> bytes:
    ends = ["\r\n" if crlf else "\n" for crlf in layout["crlf"][: len(lines)]]
    if lines and not layout["final_newline"]:
        ends[-1] = ""
    return (BOM if layout["bom"] else b"") + "".join(map(str.__add__, lines, ends)).encode("utf-8")


def spec_lines(content: bytes) -> list[str]:
    """The rule, written on whole strings: drop \\r, split on \\n, no empty piece after the last \\n, no BOM."""
    pieces = content.decode("utf-8").replace("\r", "").split("\n")
    if pieces[-1] == "":
        pieces.pop()
    if pieces and pieces[0].startswith("\ufeff"):
        pieces[0] = pieces[0][1:]
    return pieces


def vocabulary_input(corpus, monkeypatch_trainer):
    """The sentences a run's vocabulary is trained on (``make_vocabulary``, SentencePiece stopped before training)."""
    from tf_transformer.run_dir import make_vocabulary

    seen = []

    def record(sentence_iterator, **kwargs):
        seen.extend(sentence_iterator)
        raise InterruptedError

    monkeypatch_trainer(record)
    with tempfile.TemporaryDirectory() as run, pytest.raises((InterruptedError, ValueError)):
        make_vocabulary(run, corpus, size=50)
    return seen


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=PAIRS, source_layout=LAYOUT, target_layout=LAYOUT, tsv_layout=LAYOUT)
def test_random_corpora_give_every_reader_the_same_pairs(monkeypatch, pairs, source_layout, target_layout, tsv_layout):
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    contents = (
        file_bytes(sources, source_layout),
        file_bytes(targets, target_layout),
        file_bytes([f"{s}\t{t}" for s, t in pairs], tsv_layout),
    )
    with tempfile.TemporaryDirectory() as directory:
        paths = write(Path(directory), *contents)
        source_lines, target_lines = spec_lines(contents[0]), spec_lines(contents[1])
        table = [tuple(line.split("\t")) for line in spec_lines(contents[2])]
        if table == [("",)]:  # an empty corpus written with a BOM: one empty line, not a pair
            with pytest.raises(DataError, match=r"x\.tsv:1: expected 'source<TAB>target'"):
                tsv_file(str(paths[2]))
            return
        assert tsv_pairs(paths[2]) == table

        def patch(function):
            monkeypatch.setattr(pipelines.vocab.spm.SentencePieceTrainer, "train", function)

        assert vocabulary_input(tsv_file(str(paths[2])), patch) == [
            side for pair in table for side in pair if side.strip()
        ]
        if len(source_lines) != len(target_lines):
            # A last line of nothing but \r (no final newline) is no line: the counts then differ.
            with pytest.raises(DataError, match="Line counts differ"):
                parallel_files(str(paths[0]), str(paths[1]))
            with pytest.raises(DataError, match="Line counts differ"):
                read_test_set(str(paths[0]), str(paths[1]))
            return
        expected = list(zip(source_lines, target_lines, strict=True))
        assert files_pairs(paths[0], paths[1]) == expected
        sentences = [side for pair in expected for side in pair if side.strip()]
        assert vocabulary_input(parallel_files(str(paths[0]), str(paths[1])), patch) == sentences

"""Reading and cleaning Penn Treebank trees (section 6.3's WSJ setup)."""

import pytest
from nltk import Tree

from pipelines import DataError
from tests.corpora import SHARED_DATA
from tf_transformer.tasks.parsing.treebank import FileRange, one_line, read_range, read_trees, strip_label

PTB = SHARED_DATA / "ptb_sample" / "mrg"

RAW = """( (S
    (NP-SBJ-1 (NNP Mr.) (NNP Vinken) )
    (VP (VBZ is)
      (NP-PRD (-NONE- *T*-2) )
      (ADJP=2 (JJ happy) (-LRB- -LRB-) (CD 1) (-RRB- -RRB-)))
    (. .) ))
( (NP (NN Headline) ))
"""


def test_labels_lose_function_tags_and_indices():
    assert [strip_label(label) for label in ("NP-SBJ-1", "NP=2", "ADVP-TMP=3", "S", "PRP$")] == [
        "NP",
        "NP",
        "ADVP",
        "S",
        "PRP$",
    ]
    assert [strip_label(label) for label in ("-LRB-", "-RRB-", "-NONE-")] == ["-LRB-", "-RRB-", "-NONE-"]


def test_cleaning_removes_the_root_empty_elements_and_emptied_constituents(tmp_path):
    path = tmp_path / "wsj_0001.mrg"
    path.write_text(RAW, encoding="utf-8")
    first, second = read_trees(str(path))
    assert one_line(first) == (
        "(S (NP (NNP Mr.) (NNP Vinken)) (VP (VBZ is) (ADJP (JJ happy) (-LRB- -LRB-) (CD 1) (-RRB- -RRB-))) (. .))"
    )
    assert one_line(second) == "(NP (NN Headline))"


@pytest.mark.parametrize(
    "text, message",
    [
        ("( (S (NP (NN a)) ))\n( (S (NN b) )", r"wsj_0002.mrg:2: tree 2: 1 bracket\(s\) never closed"),
        ("( (S (NN a)) ))", r"wsj_0002.mrg:1: tree 2: a '\)' closes nothing"),
        ("( (S (NN a)) )\nstray words", r"wsj_0002.mrg:2: text outside a tree"),
        ("( (S (NN a)) )\n( (S (-NONE- *T*) ))", r"wsj_0002.mrg:2: tree 2: no words left"),
        ("( (S (NN a) (NN b) c) )", r"wsj_0002.mrg:1: tree 1: the word 'c' is not under a preterminal"),
    ],
)
def test_a_bad_tree_is_named_by_file_line_and_number(tmp_path, text, message):
    path = tmp_path / "wsj_0002.mrg"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        read_trees(str(path))


def test_file_ranges_select_by_name(tmp_path):
    for number in range(1, 6):
        (tmp_path / f"wsj_{number:04d}.mrg").write_text("( (S (NN a)) )", encoding="utf-8")
    names = lambda spec: [p.rsplit("/", 1)[1] for p in FileRange(spec).select(str(tmp_path))]  # noqa: E731
    assert names("wsj_0002-wsj_0004") == ["wsj_0002.mrg", "wsj_0003.mrg", "wsj_0004.mrg"]
    assert names("wsj_0001,wsj_0005") == ["wsj_0001.mrg", "wsj_0005.mrg"]
    with pytest.raises(DataError, match="no treebank files 'wsj_0100-wsj_0200'"):
        FileRange("wsj_0100-wsj_0200").select(str(tmp_path))
    with pytest.raises(DataError, match="treebank directory not found"):
        FileRange("wsj_0001").select(str(tmp_path / "missing"))


@pytest.mark.skipif(not PTB.is_dir(), reason=f"the Penn Treebank sample is not at {PTB}")
def test_the_wsj_sample_reads_whole():
    train = read_range(str(PTB), "wsj_0001-wsj_0159")
    dev = read_range(str(PTB), "wsj_0160-wsj_0179")
    assert (len(train), len(dev)) == (3396, 273)
    labels = {node.label() for tree in train + dev for node in tree.subtrees()}
    assert "" not in labels and "-NONE-" not in labels
    assert not any("=" in label or (label[0] != "-" and "-" in label) for label in labels)
    assert all(isinstance(tree, Tree) and tree.leaves() for tree in train)

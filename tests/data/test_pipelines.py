"""pipelines/: sources, vocabulary, in-graph tokenization, token-budget batches, caching."""

import collections
import logging
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

import pipelines
from pipelines import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    DataError,
    Tokenizer,
    find_split,
    parallel_files,
    train_sentencepiece,
    training_dataset,
    tsv_file,
)
from tests.corpora import SHARED_DATA, WORDS, write_corpus


def collect(dataset):
    return [(features["inputs"].numpy(), features["targets"].numpy(), labels.numpy()) for features, labels in dataset]


# --- vocabulary and tokenization -------------------------------------------------------------


def test_special_ids_are_fixed(tokenizer):
    processor = tokenizer.python_processor()
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (
        PAD_ID,
        UNK_ID,
        BOS_ID,
        EOS_ID,
    )
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)


def test_in_graph_ids_equal_sentencepiece_library(tokenizer):
    texts = ["alpha beta", "Haus Baum katze.", "", "ünïcödé 日本語 🙂 zeta", "  omega  sigma "]
    ragged = tokenizer.tokenize(tf.constant(texts))
    processor = tokenizer.python_processor()
    assert ragged.to_list() == [processor.encode(text) for text in texts]
    assert UNK_ID in ragged.to_list()[3]  # characters the vocabulary never saw


def test_detokenize_inverts_tokenize_on_normalized_text(tokenizer):
    texts = ["alpha beta gamma", "Haus  baum katze.", "omega"]
    normalized = [" ".join(unicodedata.normalize("NFKC", t).split()) for t in texts]
    ids = tokenizer.tokenize(tf.constant(normalized))
    assert [s.decode() for s in tokenizer.detokenize(ids).numpy()] == normalized
    # Dense ids padded with 0 and carrying BOS/EOS detokenize the same.
    dense = ids.to_tensor()
    framed = tf.concat([tf.fill([3, 1], BOS_ID), dense, tf.fill([3, 1], EOS_ID), tf.zeros([3, 2], tf.int32)], 1)
    assert [s.decode() for s in tokenizer.detokenize(framed).numpy()] == [
        s.decode() for s in tokenizer.detokenize(ids).numpy()
    ]


def test_vocabulary_options(corpus_dir, tmp_path):
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    path = train_sentencepiece(corpus.pairs(), str(tmp_path / "uni.model"), vocab_size=80, model_type="unigram")
    assert Tokenizer(path).vocab_size <= 80
    sampled = train_sentencepiece(corpus.pairs(), str(tmp_path / "s.model"), vocab_size=60, max_sentences=50)
    assert Tokenizer(sampled).vocab_size <= 60
    with pytest.raises(ValueError, match="model_type"):
        train_sentencepiece(corpus.pairs(), str(tmp_path / "x.model"), model_type="wordpiece")
    assert not (tmp_path / "x.model").exists()


# --- batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("pad_to_bucket_boundary", [False, True])
@pytest.mark.parametrize("num_replicas", [1, 2])
def test_batches_keep_the_contract_and_the_budget(corpus_dir, tokenizer, pad_to_bucket_boundary, num_replicas):
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    budget = 640
    data = training_dataset(
        corpus,
        tokenizer,
        tokens_per_batch=budget,
        max_train_length=64,
        num_replicas=num_replicas,
        pad_to_bucket_boundary=pad_to_bucket_boundary,
        seed=1,
    )
    expected_lengths = collections.Counter(
        (
            len(tokenizer.python_processor().encode(s.strip())) + 1,
            len(tokenizer.python_processor().encode(t.strip())) + 1,
        )
        for s, t in corpus.pairs()
    )
    seen = collections.Counter()
    shapes = set()
    filler = 0  # all-padding rows
    for inputs, decoder_input, labels in collect(data.dataset):
        assert inputs.dtype == np.int32 and labels.dtype == np.int32
        assert decoder_input.shape == labels.shape
        assert inputs.size <= budget and labels.size <= budget
        if pad_to_bucket_boundary:
            assert inputs.shape[1] == labels.shape[1] and inputs.shape[1] % 8 == 0
        shapes.add((inputs.shape, labels.shape))
        for src_row, dec_row, lab_row in zip(inputs, decoder_input, labels, strict=True):
            src_len, tgt_len = np.count_nonzero(src_row), np.count_nonzero(lab_row)
            if src_len == 0:  # an all-padding row that fills a bucket's last batch, or the last merged batch
                assert tgt_len == 0 and not dec_row.any()
                filler += 1
                continue
            assert src_row[src_len - 1] == EOS_ID and not src_row[src_len:].any()
            assert lab_row[tgt_len - 1] == EOS_ID and not lab_row[tgt_len:].any()
            assert dec_row[0] == BOS_ID and np.array_equal(dec_row[1:tgt_len], lab_row[: tgt_len - 1])
            assert not dec_row[tgt_len:].any()
            seen[(src_len, tgt_len)] += 1
    # Every pair exactly once, sides not swapped (sources are much shorter than targets here).
    assert seen == expected_lengths
    assert data.stats.kept == sum(expected_lengths.values())
    if not pad_to_bucket_boundary:  # only the last merged batch is topped up, to a multiple of 8 rows
        assert filler < data.buckets.merge_unit
    if pad_to_bucket_boundary:
        assert len(shapes) <= len(data.buckets.padded_lengths)


def test_same_seed_same_batches(corpus_dir, tokenizer):
    corpus = find_split(str(corpus_dir), "train", "en", "de")

    def run(seed):
        data = training_dataset(
            corpus, tokenizer, tokens_per_batch=512, max_train_length=64, seed=seed, deterministic=True
        )
        return collect(data.dataset)

    first, second, other = run(7), run(7), run(8)
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert any(a[0].shape != b[0].shape or not np.array_equal(a[0], b[0]) for a, b in zip(first, other, strict=False))


def test_length_filter_reports_what_it_drops(tmp_path, tokenizer, caplog):
    long_line = " ".join(["epsilon"] * 80)
    write_corpus(tmp_path, n=20, extra=[("", "Haus."), ("alpha", "   "), (long_line, "beta."), ("gamma", "delta.")])
    corpus = find_split(str(tmp_path), "train", "en", "de")
    with caplog.at_level(logging.INFO):
        data = training_dataset(corpus, tokenizer, tokens_per_batch=512, max_train_length=40)
    stats = data.stats
    assert (stats.pairs, stats.empty, stats.too_long, stats.kept) == (24, 2, 1, 21)
    rows = sum(int(np.count_nonzero(inputs.any(axis=1))) for inputs, _, _ in collect(data.dataset))
    assert rows == 21
    assert "dropped 2 with an empty side and 1 longer than 40" in caplog.text


def test_tsv_source_gives_the_same_pairs(tmp_path, corpus_dir, tokenizer):
    src = (corpus_dir / "train.en").read_text().splitlines()
    tgt = (corpus_dir / "train.de").read_text().splitlines()
    (tmp_path / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)))
    corpus = tsv_file(str(tmp_path / "train.tsv"))
    assert list(corpus.pairs()) == list(zip(src, tgt, strict=True))
    data = training_dataset(corpus, tokenizer, tokens_per_batch=512, max_train_length=64)
    seen = collections.Counter(
        (int(np.count_nonzero(s)), int(np.count_nonzero(lab)))
        for inputs, _, labels in collect(data.dataset)
        for s, lab in zip(inputs, labels, strict=True)
        if lab.any()  # not an all-padding row
    )
    processor = tokenizer.python_processor()
    assert seen == collections.Counter(
        (len(processor.encode(s)) + 1, len(processor.encode(t)) + 1) for s, t in zip(src, tgt, strict=True)
    )


def test_merged_leftovers_keep_padding_low(tmp_path, tokenizer):
    """An epoch's leftovers cut where they pad least: a corpus of broadly spread lengths, small batches."""
    rng = np.random.default_rng(0)
    words = rng.lognormal(np.log(8), 0.45, size=1000).clip(1, 40).astype(int)  # [pairs]
    (tmp_path / "train.en").write_text("".join(" ".join(rng.choice(WORDS, n)) + "\n" for n in words))
    (tmp_path / "train.de").write_text(
        "".join(" ".join(rng.choice(WORDS, max(1, n + rng.integers(-2, 3)))) + "\n" for n in words)
    )
    corpus = find_split(str(tmp_path), "train", "en", "de")
    data = training_dataset(corpus, tokenizer, tokens_per_batch=4096, max_train_length=256, seed=0)
    real = padded = 0
    for features, labels in data.dataset:
        real += int(np.count_nonzero(features["inputs"])) + int(np.count_nonzero(labels))
        padded += features["inputs"].shape.num_elements() + labels.shape.num_elements()
    # Each batch filled to the brim with the leftovers, longest first, gave 0.70 here; this plan 0.76.
    assert real / padded > 0.73
    # Still as few batches as the budget allows: fewer than one partial batch per bucket.
    processor = tokenizer.python_processor()
    plan = data.buckets.epoch_plan(
        [max(len(processor.encode(s)), len(processor.encode(t))) + 1 for s, t in corpus.pairs()]
    )
    assert data.stats.kept == 1000 and data.batches_per_epoch == plan.batches
    assert plan.partial_batches > len(plan.merged_rows)


# --- bad input --------------------------------------------------------------------------------------


def test_mismatched_line_counts_name_both_files(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    with pytest.raises(DataError, match=r"a\.en has 3 lines but .*a\.de has 2"):
        parallel_files(str(tmp_path / "a.en"), str(tmp_path / "a.de"))


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_bytes(b"eins\nzwei \xff\xfe kaputt\ndrei\n")
    with pytest.raises(DataError, match=r"a\.de:2: invalid UTF-8"):
        parallel_files(str(tmp_path / "a.en"), str(tmp_path / "a.de"))


def test_missing_file_is_named(tmp_path):
    (tmp_path / "train.en").write_text("one\n")
    with pytest.raises(DataError, match=r"Target file not found: .*train\.de"):
        find_split(str(tmp_path), "train", "en", "de")


def test_bad_tsv_line_is_named(tmp_path):
    (tmp_path / "x.tsv").write_text("a\tb\nno tab here\n")
    with pytest.raises(DataError, match=r"x\.tsv:2: expected 'source<TAB>target'"):
        tsv_file(str(tmp_path / "x.tsv"))


def test_empty_corpus_after_filtering_is_an_error(tmp_path, tokenizer):
    (tmp_path / "train.en").write_text("\n  \n" + " ".join(["alpha"] * 90) + "\n")
    (tmp_path / "train.de").write_text("Haus.\n\nBaum.\n")
    corpus = find_split(str(tmp_path), "train", "en", "de")
    with pytest.raises(DataError, match="No training pairs left.*dropped 2 with an empty side and 1 longer"):
        training_dataset(corpus, tokenizer, tokens_per_batch=512, max_train_length=32)


# --- TFDS --------------------------------------------------------------------------------------------


def test_tfds_source_with_tfds_mocking():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        pairs = list(pipelines.tfds_pairs("ted_hrlr_translate/pt_to_en", "train", "pt", "en").as_numpy_iterator())
    assert len(pairs) == 6 and all(isinstance(s, bytes) and isinstance(t, bytes) for s, t in pairs)


def test_tfds_name_as_data_is_written_once_to_text_files(tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    monkeypatch.setenv("TFT_TEXT_CACHE", str(tmp_path))
    name = "ted_hrlr_translate/pt_to_en"
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        expected = [
            tuple(" ".join(x.decode("utf-8").splitlines()) for x in pair)
            for pair in pipelines.tfds_pairs(name, "train", "pt", "en").as_numpy_iterator()
        ]
        corpus = pipelines.find_split(f"tfds:{name}", "train", "pt", "en")
    (text_dir,) = tmp_path.iterdir()
    assert text_dir.name.startswith("ted_hrlr_translate__pt_to_en__1.0.0__")  # name, config, version, data_dir
    assert corpus.source_path == str(text_dir / "train.pt")
    assert list(corpus.pairs()) == expected and corpus.num_lines == 6
    assert sorted(p.name for p in text_dir.iterdir()) == ["train.en", "train.pt"]

    def no_second_load(*args, **kwargs):
        raise AssertionError("the text files are reused, TFDS is not read again")

    monkeypatch.setattr(tfds, "load", no_second_load)
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):  # the same data_dir
        assert list(pipelines.find_split(f"tfds:{name}", "train", "pt", "en").pairs()) == expected


def test_tfds_text_cache_is_keyed_by_version_and_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFT_TEXT_CACHE", str(tmp_path))
    key = pipelines.sources.tfds_text_dir
    first = key("wmt14_translate/de-en/1.0.0", "/data/tfds/wmt14_translate/de-en/1.0.0")
    assert first.startswith(str(tmp_path / "wmt14_translate__de-en__1.0.0__"))
    assert key("wmt14_translate/de-en/1.0.0", "/data/tfds/wmt14_translate/de-en/1.0.0") == first
    assert key("wmt14_translate/de-en/1.0.1", "/data/tfds/wmt14_translate/de-en/1.0.1") != first
    assert key("wmt14_translate/de-en/1.0.0", "/other/tfds/wmt14_translate/de-en/1.0.0") != first


def test_tfds_offline_failure_says_what_to_do(monkeypatch):
    import tensorflow_datasets as tfds

    def offline(*args, **kwargs):
        raise ConnectionError("Failed to establish a new connection")

    monkeypatch.setattr(tfds, "load", offline)
    with pytest.raises(DataError, match=r"(?s)wmt14_translate/de-en.*offline.*tfds build.*--data"):
        pipelines.tfds_pairs("wmt14_translate/de-en", "train", "en", "de", data_dir="/nonexistent")


# --- real data ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not (SHARED_DATA / "multi30k").is_dir(), reason=f"real corpora not found at {SHARED_DATA}")
def test_multi30k_batches_within_budget(tmp_path):
    corpus = find_split(str(SHARED_DATA / "multi30k"), "train", "en", "de")
    assert corpus.num_lines == 29000
    model = train_sentencepiece(corpus.pairs(), str(tmp_path / "sp.model"), vocab_size=4000, max_sentences=20000)
    tokenizer = Tokenizer(model)
    data = training_dataset(
        corpus, tokenizer, tokens_per_batch=25_000, max_train_length=256, pad_to_bucket_boundary=True
    )
    rows = 0
    for features, labels in data.dataset:
        assert features["inputs"].shape.num_elements() <= 25_000 and labels.shape.num_elements() <= 25_000
        rows += int(tf.math.count_nonzero(tf.reduce_any(features["inputs"] > 0, axis=1)))
    assert rows == data.stats.kept == 29000


def _rows(batch):
    """A batch's real rows as hashable ``(source, target)`` ids (all-padding rows left out)."""
    (features, labels) = batch
    return [
        (src[src > 0].tobytes(), lab[lab > 0].tobytes())
        for src, lab in zip(features["inputs"].numpy(), labels.numpy(), strict=True)
        if lab.any()
    ]


def _repeated(corpus_dir, tokenizer, **kwargs):
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    settings = dict(tokens_per_batch=512, max_train_length=64, repeat=True, seed=3, deterministic=True) | kwargs
    return training_dataset(corpus, tokenizer, **settings)


@pytest.mark.parametrize("pad_to_bucket_boundary", [False, True])
def test_every_epoch_holds_each_pair_once_in_batches_per_epoch_batches(corpus_dir, tokenizer, pad_to_bucket_boundary):
    data = _repeated(corpus_dir, tokenizer, pad_to_bucket_boundary=pad_to_bucket_boundary)
    processor = tokenizer.python_processor()
    corpus = find_split(str(corpus_dir), "train", "en", "de")
    expected = collections.Counter(
        tuple(np.array(processor.encode(side.strip()) + [EOS_ID], np.int32).tobytes() for side in pair)
        for pair in corpus.pairs()
    )
    assert sum(expected.values()) == data.stats.kept
    per_batch = data.batches_per_epoch
    batches = list(data.dataset.take(3 * per_batch))
    epochs = [batches[e * per_batch : (e + 1) * per_batch] for e in range(3)]
    for epoch in epochs:
        assert collections.Counter(row for batch in epoch for row in _rows(batch)) == expected
        for features, labels in epoch:
            assert features["inputs"].shape.num_elements() <= 512 and labels.shape.num_elements() <= 512
            # Every batch, the last merged one topped up with all-padding rows, splits evenly over 8 replicas.
            assert data.buckets.merge_unit == 8 and labels.shape[0] % 8 == 0
    # Merging the buckets' leftovers saves batches against one partial batch per bucket.
    plan = data.buckets.epoch_plan([max(len(s), len(t)) // 4 for s, t in expected.elements()])  # int32: 4 bytes
    assert plan.partial_batches > len(plan.merged_rows)
    # Each epoch is shuffled differently.
    orders = [[row for batch in epoch for row in _rows(batch)] for epoch in epochs]
    assert orders[0] != orders[1] and orders[1] != orders[2]


@pytest.mark.parametrize("pad_to_bucket_boundary", [False, True])
def test_stream_started_at_a_batch_equals_the_full_stream_skipped(corpus_dir, tokenizer, pad_to_bucket_boundary):
    data = _repeated(corpus_dir, tokenizer, pad_to_bucket_boundary=pad_to_bucket_boundary)
    per_batch = data.batches_per_epoch
    full = collect(data.dataset.take(3 * per_batch))
    for start in (0, per_batch - 2, per_batch, 2 * per_batch + 1):  # across an epoch boundary, and into epoch 2
        started = collect(data.starting_at(start).take(per_batch - 1))
        assert len(started) == per_batch - 1
        for a, b in zip(started, full[start:], strict=False):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)


def test_repeated_stream_is_the_same_for_the_same_seed(corpus_dir, tokenizer):
    first, second, other = (_repeated(corpus_dir, tokenizer, seed=seed) for seed in (7, 7, 8))
    count = 2 * first.batches_per_epoch + 1
    a, b, c = (collect(data.dataset.take(count)) for data in (first, second, other))
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)
    assert any(x[0].shape != y[0].shape or not np.array_equal(x[0], y[0]) for x, y in zip(a, c, strict=True))

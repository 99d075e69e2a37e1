"""Cached incremental decoding and beam search (section 6.1)."""

import functools
import math

import numpy as np
import pytest
import tensorflow as tf

from configs import get_config
from tests.decoding.reference import reference_beam_search, reference_greedy
from tf_transformer import build_transformer
from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding.beam_search import beam_search, length_penalty
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.incremental import IncrementalDecoder
from tf_transformer.decoding.packing import encode_tokens
from tf_transformer.inference.translator import Translator

RNG = np.random.default_rng(5)


@pytest.mark.parametrize(
    "overrides, dtype, atol",
    [
        ({}, None, 1e-4),
        ({"pre_norm": True, "position": "learned"}, None, 1e-4),
        ({"attention_bias": True, "key_dim": 8, "value_dim": 12}, None, 1e-4),  # fused q|k|v of unequal widths
        ({"encoder_layers": 3, "decoder_layers": 1}, None, 1e-4),  # a deep encoder, a shallow decoder
        # Decoding kernels cast once per search instead of per call; the cache's self-attention products run
        # in another kernel (Eigen's, few rows) than the full pass's (oneDNN's), each rounding to bfloat16 in its
        # own places: up to 0.041 apart on logits of magnitude ~2, a few units in bfloat16's last place (2^-7).
        ({}, "mixed_bfloat16", 5e-2),
    ],
)
def test_cached_steps_equal_the_full_forward_pass(overrides, dtype, atol):
    model = build_transformer(get_config("tiny", **overrides), dtype=dtype)
    decoding = IncrementalDecoder(model)
    rng = np.random.default_rng(5)  # the same inputs whichever tests ran before
    source = rng.integers(4, 256, (2, 7)).astype("int32")
    source[1, 5:] = 0  # padding: zero memory keys and values there when packed, masked either way
    # 12 positions: past the first cache block of 8, in a cache of 13 (not a whole number of blocks).
    targets = np.concatenate([np.full((2, 1), BOS_ID), rng.integers(4, 256, (2, 11))], axis=1).astype("int32")
    full = np.asarray(model({"inputs": source, "targets": targets}, training=False))  # [2, 12, vocab]
    # As a Translator decodes (projections of real tokens only, zeros at padding) and from the padded encoder.
    for packed in (True, False):
        if packed:
            memory, memory_mask = encode_tokens(model, source)
            constants = decoding.constants(memory, memory_mask=memory_mask)
        else:
            memory, memory_mask = model.encode(source, training=False)
            constants = decoding.constants(memory)
        caches = decoding.empty_cache(2, 13, memory.dtype)
        for step in range(targets.shape[1]):
            logits, caches = decoding.step(targets[:, step], caches, constants, memory_mask, step)
            # bfloat16 rounds to 8 significant bits: allow a few units in the last place of each logit.
            rtol = 2e-2 if dtype == "mixed_bfloat16" else 0.0
            np.testing.assert_allclose(np.asarray(logits), full[:, step], atol=atol, rtol=rtol)


@pytest.mark.parametrize("max_output_length", [None, 5])
def test_greedy_search_equals_the_uncached_reference(max_output_length):
    """Greedy search over the cache picks what re-running the whole decoder picks, at every length limit."""
    model = build_transformer(get_config("tiny"))
    source = RNG.integers(4, 256, (3, 6)).astype("int32")
    source[2, 3:] = 0
    source[np.arange(3), [5, 5, 2]] = EOS_ID
    expected = np.asarray(reference_greedy(model, source, max_extra_length=8, max_output_length=max_output_length))
    if max_output_length is not None:  # the reference cuts rows at the cap; the search ends them there with EOS
        cut = expected[:, :max_output_length].copy()
        unfinished = ~(cut == EOS_ID).any(axis=1)
        cut[unfinished, -1] = EOS_ID
        expected = cut
    search = tf.function(lambda x: greedy_search(model, x, max_extra_length=8, max_output_length=max_output_length))
    got = np.asarray(search(source))
    width = max(expected.shape[1], got.shape[1])
    pad = lambda a: np.pad(a, [(0, 0), (0, width - a.shape[1])])  # noqa: E731
    np.testing.assert_array_equal(pad(got), pad(expected))
    ends = (pad(got) == EOS_ID).argmax(axis=1)  # every row ends in EOS, within its limit
    assert (pad(got)[np.arange(3), ends] == EOS_ID).all()
    assert (ends + 1 <= (source != PAD_ID).sum(axis=1) + 8).all()


def test_greedy_search_of_one_sentence_traced_alone():
    """A batch of one with its shape known when traced (TensorBoard's attention images) translates as in a batch."""
    model = build_transformer(get_config("tiny"))
    source = np.array([[7, 8, 9, EOS_ID], [10, 11, EOS_ID, 0]], "int32")
    batch = np.asarray(greedy_search(model, source, max_extra_length=6))
    for row in range(2):
        real = source[row : row + 1, : int((source[row] != PAD_ID).sum())]  # [1, its length]: no padding
        alone = np.asarray(tf.function(lambda x: greedy_search(model, x, max_extra_length=6))(real))[0]
        np.testing.assert_array_equal(alone, batch[row, : len(alone)])


# A hand-set probability table. Tokens: 0 pad, 1 unk, 2 BOS, 3 EOS, 4 "a", 5 "b".
# The next-token distribution depends only on the previous token:
#   after BOS: a 0.5, b 0.4, EOS 0.1
#   after a:   EOS 0.4, a 0.3, b 0.3
#   after b:   EOS 0.9, a 0.05, b 0.05
# Greedy takes a then EOS: p = 0.5 · 0.4 = 0.20. Beam search (K = 2) also keeps
# "b" and finds b EOS: p = 0.4 · 0.9 = 0.36, the better translation.
TABLE = {
    BOS_ID: {4: 0.5, 5: 0.4, EOS_ID: 0.1},
    4: {EOS_ID: 0.4, 4: 0.3, 5: 0.3},
    5: {EOS_ID: 0.9, 4: 0.05, 5: 0.05},
}


def table_step(ids, cache, step):
    rows = []
    for token in range(6):
        row = np.full(6, 1e-12)
        for nxt, p in TABLE.get(token, {EOS_ID: 1.0}).items():
            row[nxt] = p
        rows.append(np.log(row / row.sum()))
    log_probs = tf.gather(tf.constant(np.array(rows), tf.float32), ids)  # [batch*beam, 6]
    return log_probs, {"calls": cache["calls"] + 1}


def run_table(beam_size, alpha, max_length=6, early_stop="exact"):
    cache = {"calls": tf.zeros([beam_size], tf.int32)}
    ids, scores, steps = beam_search(
        table_step, cache, 1, tf.constant([max_length]), beam_size=beam_size, alpha=alpha, early_stop=early_stop
    )
    return np.asarray(ids)[0], np.asarray(scores)[0], int(steps)


def test_golden_beam_search_with_length_penalty():
    """The exact bound: the search stops once no live hypothesis can beat the finished ones."""
    ids, scores, steps = run_table(beam_size=2, alpha=0.6)
    assert list(ids[0][:2]) == [5, EOS_ID]  # b EOS
    assert scores[0] == pytest.approx(math.log(0.4 * 0.9) / ((5 + 2) / 6) ** 0.6, rel=1e-5)
    # Second best: a EOS (0.20), scored with the same 2-token penalty; "EOS" alone
    # (0.1, length 1) scores log(0.1) / 1 = −2.30 < log(0.2) / 1.097 = −1.47.
    assert list(ids[1][:2]) == [4, EOS_ID]
    assert scores[1] == pytest.approx(math.log(0.2) / ((5 + 2) / 6) ** 0.6, rel=1e-5)
    # Early stop. After step 1 the finished b EOS (−0.931) and a EOS (−1.467) are not
    # safe yet: the live "a a" (log 0.15 = −1.897) could still score −1.897 / ((5+6)/6)^0.6
    # = −1.319 at the maximum length of 6. After step 2 the live beams are "a a a" and
    # "a a b" (log 0.045 = −3.101, at best −2.156), below both: three steps, not six.
    assert steps == 3
    # Greedy (beam 1) takes the locally best "a" and ends with the worse a EOS.
    greedy, greedy_scores, _ = run_table(beam_size=1, alpha=0.6)
    assert list(greedy[0][:2]) == [4, EOS_ID]


def test_golden_beam_search_stopping_once_k_finished():
    """fairseq's and CTranslate2's rule: a sentence stops once K hypotheses ended among its K best continuations."""
    ids, scores, steps = run_table(beam_size=2, alpha=0.6, early_stop="finished")
    # Step 0's two best continuations are "a" (0.5) and "b" (0.4): none ends. Step 1's are
    # b EOS (0.36) and a EOS (0.20): the second K = 2 ended, so the search stops after two
    # steps, where the exact bound needed three, with the same hypotheses and scores.
    assert steps == 2
    assert [list(row[:2]) for row in ids] == [[5, EOS_ID], [4, EOS_ID]]
    assert scores[0] == pytest.approx(math.log(0.4 * 0.9) / ((5 + 2) / 6) ** 0.6, rel=1e-5)
    assert scores[1] == pytest.approx(math.log(0.2) / ((5 + 2) / 6) ** 0.6, rel=1e-5)
    # Beam 1 stops when its one hypothesis ends: greedy search's "a EOS", in two steps.
    greedy, _, greedy_steps = run_table(beam_size=1, alpha=0.6, early_stop="finished")
    assert list(greedy[0][:2]) == [4, EOS_ID] and greedy_steps == 2


def test_best_rule_stops_once_the_best_continuation_ends(monkeypatch):
    """OpenNMT-py's rule: a sentence stops once the best continuation of a step ends (and the n-best asked did).

    After BOS: a 0.6, b 0.3, EOS 0.1; after a: a 0.9, EOS 0.1; after b: EOS 1.0 (as the
    test below). Step 1's best continuation is "a a" (0.54), live; step 2's is "a a a"
    (0.486), live; after a, "a" stays best, so the search runs to the maximum length of 4,
    where "a a a EOS" (0.0486) is below "b EOS" (0.3) ended at step 1. With the table
    changed so that after "a" EOS is best (0.9), step 1's best is "a EOS" (0.54): the
    search stops after two steps, where "finished" also waits for a second ended
    hypothesis among the K best and the exact bound longer. Two n-best need two finished.
    """
    monkeypatch.setitem(
        globals(), "TABLE", {BOS_ID: {4: 0.6, 5: 0.3, EOS_ID: 0.1}, 4: {4: 0.1, EOS_ID: 0.9}, 5: {4: 0.9, EOS_ID: 0.1}}
    )
    ids, scores, steps = run_table(beam_size=2, alpha=0.0, max_length=8, early_stop="best")
    assert steps == 2
    assert list(ids[0][:2]) == [4, EOS_ID] and scores[0] == pytest.approx(math.log(0.54), rel=1e-5)
    _, _, finished_steps = run_table(beam_size=2, alpha=0.0, max_length=8, early_stop="finished")
    assert finished_steps > steps
    cache = {"calls": tf.zeros([2], tf.int32)}
    two = beam_search(table_step, cache, 1, tf.constant([8]), beam_size=2, alpha=0.0, early_stop="best", min_finished=2)
    ids, scores, steps = (np.asarray(x) for x in two)
    # Step 1 ends "a EOS" (0.54) and "EOS" (0.1) ended at step 0: two finished, two steps.
    assert int(steps) == 2 and list(ids[0, 1][:1]) == [EOS_ID]


def test_finished_rule_counts_only_the_k_best_continuations(monkeypatch):
    """An EOS ranked below the K best continuations joins the finished hypotheses but does not end the search.

    After BOS: a 0.6, b 0.3, EOS 0.1 (K = 2: "a" and "b" continue; EOS, third, is kept
    as finished but not counted). After a: a 0.9, EOS 0.1; after b: EOS 1.0. Step 1's two
    best are "a a" (0.54) and "b EOS" (0.3): one ended. Step 2's are "a a a" (0.486) and
    "a a EOS" (0.054): the second K ended, so the search stops after three steps. Counting
    every ended continuation would have stopped after step 1 with EOS alone and b EOS.
    """
    monkeypatch.setitem(
        globals(), "TABLE", {BOS_ID: {4: 0.6, 5: 0.3, EOS_ID: 0.1}, 4: {4: 0.9, EOS_ID: 0.1}, 5: {EOS_ID: 1.0}}
    )
    ids, scores, steps = run_table(beam_size=2, alpha=0.0, max_length=8, early_stop="finished")
    assert steps == 3
    assert list(ids[0][:2]) == [5, EOS_ID] and scores[0] == pytest.approx(math.log(0.3), rel=1e-5)
    assert list(ids[1][:1]) == [EOS_ID] and scores[1] == pytest.approx(math.log(0.1), rel=1e-5)


def test_length_penalty_changes_the_winner(monkeypatch):
    """With α = 0 the short hypothesis wins; a large α favours the long one (hand-computed)."""
    # after BOS: EOS 0.5, a 0.5; after a: EOS 0.3, a 0.7.
    monkeypatch.setitem(globals(), "TABLE", {BOS_ID: {EOS_ID: 0.5, 4: 0.5}, 4: {EOS_ID: 0.3, 4: 0.7}})
    # α = 0: EOS alone has p 0.5; every longer one has at most 0.5 · 0.3 = 0.15.
    ids, scores, _ = run_table(beam_size=3, alpha=0.0)
    assert ids[0][0] == EOS_ID and scores[0] == pytest.approx(math.log(0.5), rel=1e-5)
    # α = 3, penalty ((5+len)/6)^3: EOS −0.693/1 = −0.693; a EOS −1.897/1.588 = −1.195;
    # a a EOS −2.254/2.370 = −0.951; a×3 EOS −2.610/3.375 = −0.773; a×4 EOS −2.967/4.630 = −0.641;
    # a×5 EOS (the maximum length, 6) −3.324/6.162 = −0.539: the longest wins.
    ids, scores, _ = run_table(beam_size=3, alpha=3.0)
    assert list(ids[0]) == [4, 4, 4, 4, 4, EOS_ID]
    expected = math.log(0.5 * 0.7**4 * 0.3) / ((5 + 6) / 6) ** 3
    assert scores[0] == pytest.approx(expected, rel=1e-5) and scores[0] == pytest.approx(-0.539, abs=1e-3)
    assert float(length_penalty(6, 3.0)) == pytest.approx((11 / 6) ** 3, rel=1e-6)


def test_output_length_is_bounded_by_input_plus_extra():
    model = build_transformer(get_config("tiny"))
    source = np.array([[9, 10, EOS_ID, 0, 0], [9, 10, 11, 12, EOS_ID]], "int32")
    ids, _, steps = Translator(model, None, DecodeOptions(beam_size=2, max_extra_length=3)).search(source)
    ids = np.asarray(ids)
    lengths = [(row != 0).sum() for row in ids[:, 0]]
    assert lengths[0] <= 3 + 3 and lengths[1] <= 5 + 3
    assert all(row[(row != 0).sum() - 1] == EOS_ID for row in ids[:, 0])
    assert int(steps) <= 8


def test_uncached_search_and_forced_length():
    model = build_transformer(get_config("tiny"))
    source = RNG.integers(4, 256, (2, 5)).astype("int32")
    source[:, -1] = EOS_ID
    translator = Translator(model, None, DecodeOptions(beam_size=3, max_extra_length=6))
    cached_ids, cached_scores, _ = translator.search(source)
    plain_ids, plain_scores, _ = reference_beam_search(translator, source)
    np.testing.assert_array_equal(np.asarray(cached_ids), np.asarray(plain_ids))
    np.testing.assert_allclose(np.asarray(cached_scores), np.asarray(plain_scores), atol=1e-4)
    forced, _, steps = translator.with_options(min_length=9, max_output_length=9).search(source)
    forced = np.asarray(forced)
    assert int(steps) == 9
    assert (forced[:, :, 8] == EOS_ID).all() and (forced[:, :, :8] != EOS_ID).all()


def test_min_and_max_output_length():
    model = build_transformer(get_config("tiny"))
    source = RNG.integers(4, 256, (3, 6)).astype("int32")
    source[:, -1] = EOS_ID
    source[0, 3:] = [EOS_ID, 0, 0]
    fixed, fixed_scores, steps = Translator(
        model, None, DecodeOptions(beam_size=2, min_length=7, max_output_length=7)
    ).search(source)
    forced, forced_scores, _ = (
        Translator(model, None, DecodeOptions(beam_size=2))
        .with_options(min_length=7, max_output_length=7)
        .search(source)
    )
    np.testing.assert_array_equal(np.asarray(fixed), np.asarray(forced))
    np.testing.assert_allclose(np.asarray(fixed_scores), np.asarray(forced_scores), rtol=1e-6)
    assert int(steps) == 7
    at_least, _, _ = Translator(model, None, DecodeOptions(beam_size=2, max_extra_length=20, min_length=12)).search(
        source
    )
    lengths = (np.asarray(at_least)[:, 0] != 0).sum(axis=1)
    assert (lengths >= 12).all() and (lengths <= 6 + 20).all()
    capped, _, steps = Translator(
        model, None, DecodeOptions(beam_size=2, max_extra_length=20, max_output_length=4)
    ).search(source)
    assert int(steps) <= 4 and np.asarray(capped).shape[-1] <= 4
    with pytest.raises(ValueError, match="max_output_length"):
        DecodeOptions(max_output_length=0)


def test_decode_step_compiles_with_xla():
    """The cached step has fixed shapes, so it runs under jit_compile with the same results."""
    model = build_transformer(get_config("tiny"))
    decoding = IncrementalDecoder(model)
    source = RNG.integers(4, 256, (2, 5)).astype("int32")
    memory, memory_mask = model.encode(source, training=False)
    constants = decoding.constants(memory)
    caches = decoding.empty_cache(2, 12, memory.dtype)
    step = tf.function(decoding.step, jit_compile=True)
    eager_caches = caches
    ids = np.full([2], BOS_ID, np.int32)
    for position in range(10):  # into the second cache block
        logits, caches = step(ids, caches, constants, memory_mask, tf.constant(position))
        expected, eager_caches = decoding.step(ids, eager_caches, constants, memory_mask, position)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-4)
        ids = np.asarray(tf.argmax(logits, -1), np.int32)


def test_frozen_translator_decodes_the_same_and_only_adds_untrained_variables():
    """Kernels laid out once (as exported) give the search the same results as laid out per call."""
    model = build_transformer(get_config("tiny"))
    source = RNG.integers(4, 256, (3, 6)).astype("int32")
    source[np.arange(3), [5, 3, 5]] = EOS_ID
    translator = Translator(model, tokenizer=None, options=DecodeOptions(beam_size=2, max_extra_length=7))
    frozen = translator.frozen()
    ids, scores, _ = translator.search(source)
    frozen_ids, frozen_scores, _ = tf.function(lambda x: frozen.search(x))(source)
    np.testing.assert_array_equal(np.asarray(frozen_ids), np.asarray(ids))
    np.testing.assert_allclose(np.asarray(frozen_scores), np.asarray(scores), atol=1e-5)
    assert translator.frozen_weights is None
    assert frozen.frozen_weights.variables and not frozen.frozen_weights.trainable_variables
    assert len(model.weights) == len(translator.model.weights)  # nothing added to the model


@pytest.mark.parametrize("batch_parts", [2, 3])
def test_batch_parts_decode_the_same_as_one_search(batch_parts):
    """Parts of unequal output lengths, a batch that does not divide evenly: same n-best, scores and steps."""
    model = build_transformer(get_config("tiny"))
    source = RNG.integers(4, 256, (5, 9)).astype("int32")
    lengths = [3, 5, 2, 9, 6]  # the longest input (and so the longest output limit) in the last part
    for row, length in enumerate(lengths):
        source[row, length - 1] = EOS_ID
        source[row, length:] = 0
    translator = Translator(model, tokenizer=None, options=DecodeOptions(beam_size=3, max_extra_length=6))
    in_graph = tf.function(
        translator.with_options(batch_parts=batch_parts).search, input_signature=[tf.TensorSpec([None, None], tf.int32)]
    )  # batch size unknown when traced, as in an export
    for batch in (source, source[:1]):  # fewer sentences than parts: the last one fills the others
        ids, scores, steps = translator.search(batch)
        split_ids, split_scores, split_steps = in_graph(batch)
        np.testing.assert_array_equal(np.asarray(split_ids), np.asarray(ids))
        np.testing.assert_allclose(np.asarray(split_scores), np.asarray(scores), atol=1e-5)
        assert int(split_steps) == int(steps)
    with pytest.raises(ValueError, match="batch_parts"):
        DecodeOptions(batch_parts=0)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_cached_beam_search_equals_uncached(beam_size):
    """Beams that reorder, share sentences and end at different steps: the cache changes nothing.

    In a graph (as exported), called twice: the cache is updated in place, so a
    buffer shared between layers or calls would show up here.
    """
    model = build_transformer(get_config("tiny"))
    source = RNG.integers(4, 256, (3, 6)).astype("int32")
    source[1, 4:] = 0
    source[np.arange(3), [5, 3, 5]] = EOS_ID
    translator = Translator(
        model, tokenizer=None, options=DecodeOptions(beam_size=beam_size, alpha=0.6, max_extra_length=7)
    )
    cached = tf.function(lambda x: translator.search(x)[:2])
    full_ids, full_scores, _ = reference_beam_search(translator, source)
    for _ in range(2):
        cached_ids, cached_scores = cached(source)
        np.testing.assert_array_equal(np.asarray(cached_ids), np.asarray(full_ids))
        np.testing.assert_allclose(np.asarray(cached_scores), np.asarray(full_scores), atol=1e-4)


def test_first_step_once_per_sentence_equals_every_hypothesis():
    """Step 0 on one row per sentence: the same logits, and after it the cache every hypothesis reads is the same."""
    model = build_transformer(get_config("tiny"))
    decoding = IncrementalDecoder(model)
    batch, size = 2, 3
    source = RNG.integers(4, 256, (batch, 6)).astype("int32")
    source[1, 4:] = 0
    memory, memory_mask = encode_tokens(model, source)
    constants = decoding.constants(memory, memory_mask=memory_mask)
    every = decoding.empty_cache(batch, 10, memory.dtype, beam_size=size)
    once = decoding.empty_cache(batch, 10, memory.dtype, beam_size=size)
    logits_every, every = decoding.step(np.full(batch * size, BOS_ID, "int32"), every, constants, memory_mask, 0)
    logits_once, once = decoding.first_step(np.full(batch, BOS_ID, "int32"), once, constants, memory_mask)
    np.testing.assert_allclose(np.asarray(logits_once), np.asarray(logits_every)[::size], atol=1e-5)
    # Every hypothesis continues beam 0 (as after beam search's step 0), each with its own token.
    from_first = np.zeros((batch, size), "int32")
    every, once = (decoding.reorder_cache(cache, from_first) for cache in (every, once))
    ids = RNG.integers(4, 256, batch * size).astype("int32")
    for step in (1, 2):
        logits_every, every = decoding.step(ids, every, constants, memory_mask, step)
        logits_once, once = decoding.step(ids, once, constants, memory_mask, step)
        np.testing.assert_allclose(np.asarray(logits_once), np.asarray(logits_every), atol=1e-5)


def test_beam_search_first_step_fn_changes_nothing():
    """A first step computed once per sentence gives the same hypotheses and scores as one per beam."""
    vocab, batch, beam = 40, 3, 4
    table = tf.constant(RNG.normal(size=(vocab, 12, vocab)).astype("float32"))  # logits by (last id, step)

    def step_fn(ids, cache, step):
        return tf.nn.log_softmax(tf.gather(table[:, step], ids), axis=-1), cache  # [rows, vocab]

    def first_step_fn(ids, cache):
        return step_fn(ids, cache, 0)

    max_lengths = tf.constant([5, 9, 7])
    plain = beam_search(step_fn, {}, batch, max_lengths, beam_size=beam, alpha=0.6, min_length=2)
    once = beam_search(
        step_fn, {}, batch, max_lengths, beam_size=beam, alpha=0.6, min_length=2, first_step_fn=first_step_fn
    )
    for a, b in zip(plain, once, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("n,k", [(8000, 8), (1280, 2), (4096, 16), (1031, 8)])
def test_chunked_top_k_equals_top_k(n, k):
    """Same values, indices and tie order as tf.math.top_k, ties and all-equal rows included."""
    from tf_transformer.decoding.top_k import top_k_rows

    x = RNG.integers(-20, 5, (3, 4, n)).astype("float32")  # many ties
    x[0, 0] = 1.0  # one row all equal
    x[1, 2, -3:] = 9.0  # the best at the very end
    values, indices = top_k_rows(tf.constant(x), k)
    expected_values, expected_indices = tf.math.top_k(tf.constant(x), k=k)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(expected_values))
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected_indices))


@pytest.mark.parametrize("n,k", [(8000, 8), (1031, 8), (6, 8)])
def test_chunked_top_k_of_sums_equals_top_k(n, k):
    """With per-part offsets: the top-k of x + offsets flattened, ties (across parts too) and all."""
    from tf_transformer.decoding.top_k import top_k_rows

    x = RNG.integers(-20, 5, (3, 4, n)).astype("float32")  # many ties, within and across parts
    x[0] = 1.0  # all equal
    x[2, 3, -3:] = 9.0  # the best at the very end
    offsets = np.array([[0.0, -1.0, 0.0, -0.5], [0.0, 0.0, 0.0, 0.0], [-0.25, -3.0, 0.0, -1.0]], "float32")
    values, indices = top_k_rows(tf.constant(x), k, offsets=tf.constant(offsets))
    expected_values, expected_indices = tf.math.top_k(tf.constant((x + offsets[:, :, None]).reshape(3, 4 * n)), k=k)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(expected_values))
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected_indices))


@pytest.mark.parametrize("vocab", [6, 2048])  # top_k over the row, and the chunked top_k_rows
def test_beam_search_ties_go_to_the_lower_beam_then_the_lower_token(vocab):
    """Equal continuations are ranked by (beam, token), with and without the chunked top-k."""
    row = np.full(vocab, 1e-6)
    row[[4, 5]] = 0.3  # after any token: "a" and "b" tie, and so do all their continuations
    log_probs = tf.constant(np.log(row / row.sum()), tf.float32)

    def step_fn(ids, cache, step):
        return tf.tile(log_probs[None], [tf.shape(ids)[0], 1]), cache  # [rows, vocab]

    ids, scores, _ = beam_search(step_fn, {}, 1, tf.constant([3]), beam_size=2, alpha=0.0, min_length=3)
    # Step 0 keeps a, b (lower token first); step 1's four equal continuations keep
    # beam 0's two, "a a" before "a b"; step 2 must end.
    np.testing.assert_array_equal(np.asarray(ids)[0], [[4, 4, EOS_ID], [4, 5, EOS_ID]])
    assert float(scores[0, 0]) == float(scores[0, 1])


@pytest.mark.parametrize("vocab", [8000, 12, 67])  # in place (width 4), in place (width 4 of 12), a select
@pytest.mark.parametrize("eos_banned", [False, True])
def test_ban_tokens_sets_pad_bos_and_eos_only(vocab, eos_banned):
    """In place or as a select (vocabulary 67: no width divides it; under XLA), only the banned ids change."""
    from tf_transformer.decoding.beam_search import NEG_INF, ban_tokens

    x = RNG.normal(size=(3, 4, vocab)).astype("float32")
    expected = x.copy()
    expected[:, :, [PAD_ID, BOS_ID] + ([EOS_ID] if eos_banned else [])] = NEG_INF
    for run in (
        lambda x: ban_tokens(tf.identity(x), tf.constant(eos_banned)),
        tf.function(lambda x: ban_tokens(x + 0.0, tf.constant(eos_banned))),
        tf.function(lambda x: ban_tokens(x + 0.0, tf.constant(eos_banned)), jit_compile=True),
    ):
        np.testing.assert_array_equal(np.asarray(run(tf.constant(x))), expected)


def _reference_continuations(log_probs, live_log_probs, step, min_length, max_lengths):
    """The selection as one vocabulary-wide additive bias, then a plain top-k: what top_continuations replaces."""
    from tf_transformer.decoding.beam_search import NEG_INF

    batch, k, vocab = log_probs.shape
    tokens = np.arange(vocab)
    banned = (tokens == PAD_ID) | (tokens == BOS_ID) | ((tokens == EOS_ID) & (step + 1 < min_length))
    bias = np.where(banned, NEG_INF, 0.0)[None, :].repeat(batch, 0)  # [batch, vocab]
    must_end = (step + 1 >= max_lengths)[:, None]
    bias = np.where(must_end, np.where(tokens == EOS_ID, 0.0, NEG_INF)[None, :], bias).astype("float32")
    candidates = live_log_probs[:, :, None] + (log_probs + bias[:, None, :])
    values, indices = tf.math.top_k(candidates.reshape(batch, k * vocab), k=2 * k)
    return np.asarray(values), np.asarray(indices)


@pytest.mark.parametrize("vocab", [8000, 67])
@pytest.mark.parametrize("step", [0, 4, 9])
def test_top_continuations_equal_a_vocabulary_wide_bias(vocab, step):
    """Same picks, values and order as the bias formulation; banned picks (dead) only where it has them too."""
    from tf_transformer.decoding.beam_search import NEG_INF, top_continuations

    batch, k = 6, 4
    logits = RNG.normal(size=(batch, k, vocab)).astype("float32") * 3
    logits[0, :, EOS_ID] = 8.0  # EOS the best where allowed
    logits[1, :, 20:24] = 5.0  # ties across beams and tokens
    log_probs = np.asarray(tf.nn.log_softmax(logits))
    live = np.array([[0.0, -1.0, -1.0, -3.0]] * batch, "float32")
    live[2, 1:] = NEG_INF  # one beam alive (as at step 0)
    live[3, :] = np.array([0.0, -0.5, -0.5, -0.5], "float32")
    max_lengths = np.array([10, 5, 10, 10, 5, 2], "int32")  # rows 1, 4 and 5 end at step 4, 1 or 9
    for min_length in (0, 8, 12):  # 12 > max_length: a row at its maximum still ends
        expected = _reference_continuations(log_probs, live, step, min_length, max_lengths)
        got = top_continuations(tf.constant(log_probs), tf.constant(live), step, min_length, tf.constant(max_lengths))
        got = [np.asarray(t) for t in got]
        alive = expected[0] > NEG_INF / 2
        np.testing.assert_array_equal(got[0][alive], expected[0][alive])
        np.testing.assert_array_equal(got[1][alive], expected[1][alive])
        assert (got[0][~alive] <= NEG_INF / 2).all()


def test_finished_rule_also_stops_at_the_exact_bound(monkeypatch):
    """Live beams that never end among the K best: the bound stops the search, with the hypotheses going on would keep.

    α = 0, K = 2. After BOS: a 0.4, b 0.35, EOS 0.25 (third: finished, not counted). After a:
    a 0.3, b 0.3, EOS 0.4; after b: a 0.5, b 0.5. Step 1's best are "b a" and "b b" (0.175);
    "a EOS" (0.16, third) finishes. Step 2's live beams "b b a" and "b b b" (0.0875) cannot beat
    the finished 0.16 any more, though from here on the K best continuations never end.
    """
    monkeypatch.setitem(
        globals(),
        "TABLE",
        {BOS_ID: {4: 0.4, 5: 0.35, EOS_ID: 0.25}, 4: {4: 0.3, 5: 0.3, EOS_ID: 0.4}, 5: {4: 0.5, 5: 0.5}},
    )
    for early_stop in ("finished", "exact"):
        ids, scores, steps = run_table(beam_size=2, alpha=0.0, max_length=8, early_stop=early_stop)
        assert steps == 3, early_stop
        assert list(ids[0][:1]) == [EOS_ID] and list(ids[1][:2]) == [4, EOS_ID]
        np.testing.assert_allclose(scores, np.log([0.25, 0.16]), rtol=1e-5)


# Eight sentences whose next token depends on the sentence and the previous token only: sentence s
# ends with probability EOS_CHANCE[s] after any token but BOS, so they end at different steps.
EOS_CHANCE = [0.9, 0.05, 0.5, 0.2, 0.7, 0.1, 0.3, 0.6]


def sentence_table_step(counter):
    """A ``step_fn`` over a cache holding each hypothesis's sentence; ``counter`` adds the rows each step computes."""
    tables = []
    for sentence, chance in enumerate(EOS_CHANCE):
        rows = np.full((6, 6), 1e-12)
        rows[:, 4], rows[:, 5], rows[:, EOS_ID] = 0.6 * (1 - chance), 0.4 * (1 - chance), chance
        rows[BOS_ID] = (
            [1e-12, 1e-12, 1e-12, 0.05, 0.5, 0.45] if sentence % 2 else [1e-12, 1e-12, 1e-12, 0.05, 0.45, 0.5]
        )
        tables.append(np.log(rows / rows.sum(axis=1, keepdims=True)))
    tables = tf.constant(np.array(tables), tf.float32)  # [sentences, previous token, next token]

    def step_fn(ids, cache, step):
        counter.assign_add(tf.shape(ids)[0])
        return tf.gather_nd(tables, tf.stack([cache["sentence"], ids], axis=1)), cache

    return step_fn


def sentence_table_compaction(beam):
    """How a search drops finished sentences from :func:`sentence_table_step`'s cache (``beam`` rows each)."""
    from tf_transformer.decoding.beam_search import Compaction

    def select(cache, keep, step):
        rows = tf.reshape(keep[:, None] * beam + tf.range(beam)[None, :], [-1])
        return {"sentence": tf.gather(cache["sentence"], rows)}

    return Compaction(select, lambda cache: {"sentence": tf.TensorShape([None])})


def sources_of_lengths(lengths, width):
    """Random token ids, one row per length, each ending in EOS and padded with zeros to ``width``."""
    source = np.zeros((len(lengths), width), "int32")  # [sentences, width]
    for row, length in enumerate(lengths):
        source[row, :length] = RNG.integers(4, 256, length)
        source[row, length - 1] = EOS_ID
    return source


def test_dropping_finished_sentences_in_the_decoder_cache_changes_nothing():
    """Sources of 2 to 12 tokens: the short ones leave while the long ones go on writing new cache blocks."""
    model = build_transformer(get_config("tiny"))
    source = sources_of_lengths([2, 12, 3, 11], width=12)
    translator = Translator(model, tokenizer=None, options=DecodeOptions(beam_size=2, alpha=0.6, max_extra_length=7))
    full_ids, full_scores, _ = reference_beam_search(translator, source)
    cached = tf.function(lambda x: translator.search(x)[:2])
    for _ in range(2):  # in a graph, twice: a shared or reused buffer would show
        ids, scores = cached(source)
        np.testing.assert_array_equal(np.asarray(ids), np.asarray(full_ids))
        np.testing.assert_allclose(np.asarray(scores), np.asarray(full_scores), atol=1e-4)


def test_dropping_finished_sentences_changes_no_hypothesis():
    """Sentences leave the loop as they end (fewer rows computed); n-best, scores and steps stay the same."""
    beam, batch = 3, len(EOS_CHANCE)
    compaction = sentence_table_compaction(beam)
    max_lengths = tf.constant([12, 12, 9, 12, 12, 12, 10, 12])
    # Sentence 2 forced to start with "a" and end right after: one beam alive, the others fill its n-best.
    prefixes = tf.constant([[0], [0], [4], [0], [0], [0], [0], [0]])
    cases = [("finished", None, max_lengths), ("exact", None, max_lengths), ("best", None, max_lengths)]
    cases.append(("finished", prefixes, tf.tensor_scatter_nd_update(max_lengths, [[2]], [2])))
    for early_stop, forced_ids, max_lengths in cases:
        outputs, computed = [], []
        for dropping in (None, compaction):
            counter = tf.Variable(0)
            cache = {"sentence": tf.repeat(tf.range(batch), beam)}  # [batch * beam]
            search = functools.partial(
                beam_search, sentence_table_step(counter), cache, batch, max_lengths, beam_size=beam, alpha=0.6,
                min_length=2, early_stop=early_stop, compaction=dropping, forced_ids=forced_ids,
            )  # fmt: skip
            outputs.append([np.asarray(x) for x in tf.function(search)()])
            computed.append(int(counter.numpy()))
        (ids, scores, steps), (dropped_ids, dropped_scores, dropped_steps) = outputs
        np.testing.assert_array_equal(dropped_ids, ids)
        np.testing.assert_allclose(dropped_scores, scores, rtol=1e-6)
        assert dropped_steps == steps
        assert computed[1] < computed[0], (early_stop, computed)  # the ended sentences were not computed
        assert len({tuple(row) for row in ids[:, 0]}) > 1  # the sentences' outputs differ: rows cannot swap
        if forced_ids is not None:  # one hypothesis, then two fillers: no tokens, NEG_INF, wherever it stopped
            assert list(ids[2, 0, :2]) == [4, EOS_ID] and (ids[2, 1:] == 0).all() and (scores[2, 1:] == -1.0e9).all()


def test_steps_between_compactions_run_no_conditional():
    """The loop that runs the steps holds no ``tf.cond``: a cond in every step lowered to a Switch and a
    Merge per carried tensor (state, cache, results); finished sentences are dropped in an outer loop."""
    beam, batch = 3, len(EOS_CHANCE)
    compaction = sentence_table_compaction(beam)
    cache = {"sentence": tf.repeat(tf.range(batch), beam)}  # [batch * beam]
    search = functools.partial(
        beam_search, sentence_table_step(tf.Variable(0)), cache, batch, tf.fill([batch], 12), beam_size=beam,
        compaction=compaction,
    )  # fmt: skip
    graph_def = tf.function(search).get_concrete_function().graph.as_graph_def()
    library = {function.signature.name: function for function in graph_def.library.function}

    def loop_bodies(nodes):
        return [library[node.attr["body"].func.name] for node in nodes if node.op in ("While", "StatelessWhile")]

    [outer] = loop_bodies(graph_def.node)
    [inner] = loop_bodies(outer.node_def)
    step_ops = {node.op for node in inner.node_def}
    assert "GatherNd" in step_ops  # the step itself (sentence_table_step) runs in the inner loop
    assert not step_ops & {"If", "StatelessIf"}, step_ops
    assert step_ops.isdisjoint({"While", "StatelessWhile"})


def test_the_models_steps_choose_their_attention_products_once_per_run_of_steps():
    """The translator's steps between compactions hold no ``tf.cond`` either: the choice of the self-attention
    products by rows (Eigen's for few, oneDNN's for many) is made around each run of steps, whose rows are
    fixed, not in every layer at every step. 10 sentences × 2 beams start above the threshold (20 rows) and
    end below it as sentences leave: both traced loops run in one search, as the reference decodes."""
    model = build_transformer(get_config("tiny"))
    source = sources_of_lengths([2, 12, 3, 11, 5, 9, 2, 7, 12, 4], width=12)
    translator = Translator(model, tokenizer=None, options=DecodeOptions(beam_size=2, alpha=0.6, max_extra_length=7))
    search = tf.function(lambda x: translator.search(x)[:2])
    graph_def = search.get_concrete_function(tf.TensorSpec([None, None], tf.int32)).graph.as_graph_def()
    library = {function.signature.name: function for function in graph_def.library.function}
    nodes = [*graph_def.node, *(node for function in library.values() for node in function.node_def)]
    bodies = [library[node.attr["body"].func.name] for node in nodes if node.op in ("While", "StatelessWhile")]
    step_loops = [ops for ops in ({node.op for node in body.node_def} for body in bodies) if "InplaceUpdate" in ops]
    assert len(step_loops) == 2, len(step_loops)  # traced with Eigen's products and with oneDNN's
    assert all(not ops & {"If", "StatelessIf"} for ops in step_loops)
    assert sorted("BatchMatMulV2" in ops for ops in step_loops) == [False, True]  # oneDNN's in one only
    full_ids, full_scores, _ = reference_beam_search(translator, source)
    ids, scores = search(source)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(full_ids))
    np.testing.assert_allclose(np.asarray(scores), np.asarray(full_scores), atol=1e-4)

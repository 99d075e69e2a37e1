"""Scoring, request-time options, sampling and target prefixes: in process, through the export and its loader."""

import numpy as np
import pytest
import tensorflow as tf

from configs import get_config
from pipelines import Tokenizer
from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.request import DecodeRequest, Sampling
from tf_transformer.decoding.sampling import filter_log_probs, sample_search
from tf_transformer.decoding.scoring import score_ids
from tf_transformer.inference.translator import Translator
from tf_transformer.model import build_transformer
from tf_transformer.run_dir import restore_model

RNG = np.random.default_rng(7)
SENTENCES = ["alpha beta gamma", "zeta omega", "", "omega sigma kappa lambda beta", "haus"]


@pytest.fixture(scope="module")
def translator(tiny_run):
    model, _ = restore_model(str(tiny_run))
    options = DecodeOptions(beam_size=4, alpha=0.6, max_extra_length=10, max_source_length=512)
    return Translator(model, Tokenizer(str(tiny_run / "sp.model")), options)


@pytest.fixture(scope="module")
def loaded(tiny_export):
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    return tf.saved_model.load(str(tiny_export)).signatures


def test_scores_are_the_log_softmax_of_the_full_forward_pass_at_the_target_ids():
    """Per token, summed and length-normalized; padding scores 0 and does not count."""
    model = build_transformer(get_config("tiny"))
    source = RNG.integers(4, 256, (3, 6)).astype("int32")
    source[1, 4:], source[np.arange(3), [5, 3, 5]] = PAD_ID, EOS_ID
    target = RNG.integers(4, 256, (3, 5)).astype("int32")
    target[0, 3:], target[np.arange(3), [2, 4, 4]] = PAD_ID, EOS_ID
    result = {key: np.asarray(value) for key, value in score_ids(model, source, target, alpha=0.6).items()}
    decoder_input = np.concatenate([np.full([3, 1], BOS_ID), target[:, :-1]], axis=1)
    logits = np.asarray(model({"inputs": source, "targets": decoder_input}), np.float64)  # [3, 5, vocab]
    log_softmax = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    log_softmax -= logits.max(-1, keepdims=True)
    expected = np.take_along_axis(log_softmax, target[:, :, None], axis=-1)[:, :, 0] * (target != PAD_ID)
    np.testing.assert_allclose(result["token_log_probs"], expected, atol=1e-4)
    np.testing.assert_array_equal(result["lengths"], [3, 5, 5])
    np.testing.assert_allclose(result["log_probs"], expected.sum(axis=1), atol=1e-4)
    np.testing.assert_allclose(result["scores"], expected.sum(axis=1) / ((5 + np.array([3, 5, 5])) / 6) ** 0.6, 1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_scoring_the_search_outputs_gives_the_search_scores(translator, alpha):
    """Every finished hypothesis of the n-best: its log-probability over its length penalty, EOS counted."""
    source = translator.encode_strings(tf.constant(SENTENCES))
    ids, scores, _ = translator.search(source, DecodeRequest(alpha=alpha))  # [batch, 4, len]
    batch, beam, length = ids.shape
    flat = tf.reshape(ids, [batch * beam, length])
    scored = score_ids(translator.model, tf.repeat(source, beam, axis=0), flat, alpha)
    ended = np.asarray(tf.reduce_any(flat == EOS_ID, axis=1))  # finished hypotheses (all are, here)
    assert ended.all()
    np.testing.assert_allclose(np.asarray(scored["scores"]), np.asarray(scores).reshape(-1), atol=2e-4)


def test_the_translator_scores_strings_as_the_search_scored_them(translator):
    outputs = translator.translate(tf.constant(SENTENCES))
    scored = translator.score(tf.constant(SENTENCES), outputs["translations"])
    real = [i for i, sentence in enumerate(SENTENCES) if sentence]  # "" translates to "" with score 0 by convention
    np.testing.assert_allclose(np.asarray(scored["scores"])[real], np.asarray(outputs["scores"])[real], atol=2e-4)
    assert np.asarray(scored["lengths"]).min() >= 1  # EOS at least


def test_eos_cannot_come_first_by_default():
    """A step function that prefers EOS at once: with the default minimum length the search writes a token first."""
    assert DecodeOptions().min_length == 2
    vocab = 12

    def step_fn(ids, cache, step):
        preferred = tf.one_hot(tf.fill(tf.shape(ids), EOS_ID), vocab, on_value=0.0, off_value=-5.0)
        return tf.nn.log_softmax(preferred), cache

    for min_length, first in ((0, EOS_ID), (DecodeOptions().min_length, None)):
        ids, _, _ = beam_search(step_fn, {}, 2, tf.constant([6, 6]), beam_size=2, alpha=0.6, min_length=min_length)
        ids = np.asarray(ids)[:, 0]  # [batch, len]: the best hypotheses
        if first == EOS_ID:
            assert (ids[:, 0] == EOS_ID).all()  # the empty output, before
        else:
            assert not np.isin(ids[:, 0], [PAD_ID, BOS_ID, EOS_ID]).any()  # a token (here UNK, the next best)
            assert (ids[:, 1] == EOS_ID).all()  # then EOS


def test_greedy_search_keeps_eos_from_coming_first(translator):
    """The model gives EOS a large bias: greedy search still writes one token before it, unless min_length 0."""
    from tf_transformer import masks

    model = build_transformer(get_config("tiny"))
    # No EOS in the source: the embedding is shared, so changing EOS's row below would
    # change the memory too, and with it the state EOS is aimed at (about 1 model in 70).
    source = tf.constant([[9, 10, 11]])
    memory, memory_mask = model.encode(source)
    bos = tf.constant([[BOS_ID]])
    hidden = model.decoder(
        model.target_embedding(bos),
        memory,
        self_attention_mask=masks.decoder_self_attention_mask(bos),
        memory_mask=memory_mask,
    )[0, 0]  # [d_model]: the decoder's state at BOS, which the output embedding scores every token with
    embedding = model.target_embedding.weights[0]
    rows = np.asarray(embedding)
    rows[EOS_ID] = 10 * np.asarray(hidden) / np.linalg.norm(hidden)  # the embedding is tied: EOS's output row
    embedding.assign(rows)
    assert np.asarray(model.decode(bos, memory, memory_mask))[0, 0].argmax() == EOS_ID
    assert np.asarray(greedy_search(model, source, max_extra_length=5, min_length=0))[0, 0] == EOS_ID
    ids = np.asarray(greedy_search(model, source, max_extra_length=5))[0]
    assert ids[0] > EOS_ID and EOS_ID in ids


def options(loaded, sentences, prefixes=None, beam_size=4, alpha=0.6, nbest=1, min_length=2, max_extra_length=10):
    """The export's ``translate_with_options`` (its own settings are beam 4, α 0.6, min 2, input + 10)."""
    return loaded["translate_with_options"](
        inputs=tf.constant(sentences),
        target_prefix=tf.constant(prefixes or [""] * len(sentences)),
        beam_size=tf.constant(beam_size),
        alpha=tf.constant(alpha),
        nbest=tf.constant(nbest),
        min_length=tf.constant(min_length),
        max_extra_length=tf.constant(max_extra_length),
    )


def test_options_at_the_defaults_equal_serving_default(loaded, tiny_export):
    """The options signature with the export's own settings: the same translations, scores and ids."""
    import sentencepiece as spm

    plain = loaded["serving_default"](inputs=tf.constant(SENTENCES))
    chosen = options(loaded, SENTENCES)
    assert chosen["translations"].shape == [len(SENTENCES), 1]
    assert chosen["translations"].numpy()[:, 0].tolist() == plain["translations"].numpy().tolist()
    np.testing.assert_array_equal(chosen["scores"].numpy()[:, 0], plain["scores"].numpy())
    processor = spm.SentencePieceProcessor(model_file=str(tiny_export / "assets" / "sp.model"))
    sources = [processor.encode(sentence) + [EOS_ID] for sentence in SENTENCES if sentence]
    width = max(map(len, sources))
    by_ids = loaded["translate_ids"](inputs=tf.constant([row + [PAD_ID] * (width - len(row)) for row in sources]))
    got = chosen["ids"].numpy()[[i for i, sentence in enumerate(SENTENCES) if sentence], 0]
    expected = by_ids["ids"].numpy()
    width = max(got.shape[1], expected.shape[1])
    pad = lambda a: np.pad(a, [(0, 0), (0, width - a.shape[1])])  # noqa: E731
    np.testing.assert_array_equal(pad(got), pad(expected))


def test_options_choose_beam_n_best_alpha_and_lengths_per_request(loaded, translator):
    """One export, several settings: each equals the in-process search with the same settings."""
    for beam_size, nbest, alpha, min_length, extra in ((8, 3, 1.0, 2, 10), (1, 1, 0.0, 6, 4), (2, 2, 0.6, 0, 10)):
        got = options(loaded, SENTENCES, None, beam_size, alpha, nbest, min_length, extra)
        assert got["translations"].shape == [len(SENTENCES), nbest] and got["scores"].shape == [len(SENTENCES), nbest]
        request = DecodeRequest(beam_size, alpha, nbest, min_length, extra)
        local = translator.translate_with_options(tf.constant(SENTENCES), None, request)
        assert got["translations"].numpy().tolist() == local["translations"].numpy().tolist()
        np.testing.assert_allclose(got["scores"].numpy(), local["scores"].numpy(), atol=1e-5)
        scores = got["scores"].numpy()
        assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first
        ids = got["ids"].numpy()
        lengths = (ids != PAD_ID).sum(axis=2)  # [batch, nbest], EOS counted
        sources = np.array([len(translator.tokenizer.tokenize(tf.constant([s]))[0]) + 1 for s in SENTENCES])
        real = np.array([bool(s) for s in SENTENCES])
        assert (lengths[real] >= min_length).all() and (lengths[real] <= sources[real, None] + extra).all()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"beam_size": 3}, "beam_size must be one of"),
        ({"nbest": 5}, "nbest must be at most beam_size"),
        ({"nbest": 0}, "nbest must be at least 1"),
        ({"max_extra_length": 11}, "max_extra_length must be at most 10"),
        ({"alpha": -1.0}, "alpha must not be negative"),
        ({"alpha": float("inf")}, "alpha must be at most 10"),
    ],
)
def test_options_out_of_range_are_refused_by_name(loaded, change, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        options(loaded, SENTENCES[:2], **change)


def test_outputs_start_with_their_target_prefix(loaded, translator):
    """Whole words, a prefix ending inside a word, none: each output begins with its prefix, scored as a whole."""
    prefixes = ["Katze", "ha", "", "zeta omega sigma", "B"]
    got = options(loaded, SENTENCES, prefixes, nbest=2)
    texts = got["translations"].numpy()
    for row, prefix in enumerate(prefixes):
        if SENTENCES[row]:
            assert all(text.decode().startswith(prefix) for text in texts[row]), (prefix, texts[row])
    local = translator.translate_with_options(tf.constant(SENTENCES), tf.constant(prefixes), DecodeRequest(nbest=2))
    assert local["translations"].numpy().tolist() == texts.tolist()
    # The prefix's tokens are part of the output and of its score: scoring the best output gives its score.
    real = [row for row, sentence in enumerate(SENTENCES) if sentence]
    scored = translator.score(tf.constant(SENTENCES), tf.constant(texts[:, 0]))
    np.testing.assert_allclose(np.asarray(scored["scores"])[real], got["scores"].numpy()[real, 0], atol=2e-4)
    ids = got["ids"].numpy()[0, 0]
    expected = np.asarray(translator.encode_prefixes(tf.constant(prefixes[:1])))[0]
    np.testing.assert_array_equal(ids[: len(expected)], expected)


def test_a_prefix_longer_than_the_usual_output_still_ends(translator):
    """The output may run one token past its prefix whatever the length limit (here input + 0)."""
    prefix = "beta " * 12
    request = DecodeRequest(max_extra_length=0)
    got = translator.translate_with_options(tf.constant(["zeta"]), tf.constant([prefix]), request)
    assert got["translations"].numpy()[0, 0].decode().startswith(prefix.strip())


def test_top_k_1_samples_the_greedy_output(translator):
    source = translator.encode_strings(tf.constant(SENTENCES))
    greedy = np.asarray(greedy_search(translator.model, source, max_extra_length=10))
    for seed in (1, 2):
        sampled, _ = sample_search(translator.model, source, seed, top_k=1, max_extra_length=10)
        np.testing.assert_array_equal(np.asarray(sampled), greedy)


def test_sampling_is_reproducible_and_seeded(translator, loaded):
    def draw(seed):
        request = DecodeRequest(max_extra_length=10, sampling=Sampling(seed=seed))
        return translator.sample(tf.constant(SENTENCES), request)["translations"].numpy().tolist()

    assert draw(3) == draw(3) and draw(3) != draw(4)
    exported = loaded["sample"](
        inputs=tf.constant(SENTENCES),
        seed=tf.constant(3, tf.int64),
        temperature=tf.constant(1.0),
        top_k=tf.constant(0),
        top_p=tf.constant(1.0),
        max_extra_length=tf.constant(10),
    )
    assert exported["translations"].numpy().tolist() == draw(3)
    # The score is the model's log-probability of the drawn pieces (temperature 1, nothing cut). Scoring the
    # text would tokenize it again, and a drawn segmentation is often not SentencePiece's own for that text.
    source = translator.encode_strings(tf.constant(SENTENCES))
    ids, log_probs = sample_search(translator.model, source, 3, temperature=0.8, top_p=0.9, max_extra_length=10)
    scored = score_ids(translator.model, source, ids, 0.0)
    np.testing.assert_allclose(np.asarray(scored["log_probs"]), np.asarray(log_probs), atol=2e-4)


def first_token_distribution(translator, temperature=1.0, top_k=0, top_p=1.0) -> np.ndarray:
    """The probabilities sampling draws the first token with: softmax of the tempered model's, cut, renormalized."""
    source = translator.encode_strings(tf.constant(["alpha beta gamma"]))
    memory, mask = translator.model.encode(source)
    logits = np.asarray(translator.model.decode(tf.constant([[BOS_ID]]), memory, mask))[0, 0].astype(np.float64)
    log_probs = logits - logits.max()
    log_probs -= np.log(np.exp(log_probs).sum())
    log_probs[[PAD_ID, BOS_ID, EOS_ID]] = -np.inf  # never first (EOS: the minimum length)
    tempered = np.exp(log_probs / temperature)
    order = np.argsort(-tempered, kind="stable")
    if top_k:
        tempered[order[top_k:]] = 0
    tempered /= tempered.sum()
    if top_p < 1:
        before = np.cumsum(tempered[order]) - tempered[order]
        tempered[order[before >= top_p]] = 0
    return tempered / tempered.sum()


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.6, "temperature": 1.5}])
def test_first_tokens_follow_the_softmax(translator, settings):
    """20,000 draws of the first token: each token's frequency within 5 standard deviations of its probability.

    Under the model's distribution each frequency is binomial; with about 100 tokens the chance that any one
    strays past 5 standard deviations is below 1e-4, and the draws are seeded, so the test is deterministic.
    Tokens cut by top-k or top-p are never drawn."""
    draws = 20_000
    expected = first_token_distribution(translator, **settings)
    source = translator.encode_strings(tf.constant(["alpha beta gamma"] * draws))
    sampled, _ = sample_search(translator.model, source, 11, max_extra_length=10, max_output_length=2, **settings)
    first = np.asarray(sampled)[:, 0]
    counts = np.bincount(first, minlength=len(expected)) / draws
    bound = 5 * np.sqrt(expected * (1 - expected) / draws) + 1e-12
    assert (np.abs(counts - expected) <= bound).all(), np.abs(counts - expected).max()
    assert not counts[expected == 0].any()
    assert (expected > 0).sum() > 1  # a distribution, not one token


def test_a_pair_score_is_normalized_as_beam_search_scores():
    from tf_transformer.inference.batch_scoring import PairScore

    score = PairScore(log_prob=-6.0, length=7, token_log_probs=(-1.0,) * 6 + (0.0,))
    assert score.normalized(0.0) == -6.0 and score.normalized(1.0) == pytest.approx(-6.0 / 2.0)


def test_sampling_options_are_checked():
    for wrong in ({"temperature": 0.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError, match=next(iter(wrong))):
            Sampling(**wrong)
    assert Sampling(seed=3).batch_seed(["a", "b"]) == Sampling(seed=3).batch_seed(["a", "b"])
    assert Sampling(seed=3).batch_seed(["a", "b"]) != Sampling(seed=3).batch_seed(["a", "c"])


def test_the_export_refuses_a_temperature_over_its_ceiling_by_name(loaded):
    for temperature in (float("inf"), 1e8):
        with pytest.raises(tf.errors.InvalidArgumentError, match="temperature must be at most 100"):
            loaded["sample"](
                inputs=tf.constant(SENTENCES[:2]),
                seed=tf.constant(3, tf.int64),
                temperature=tf.constant(temperature),
                top_k=tf.constant(0),
                top_p=tf.constant(1.0),
                max_extra_length=tf.constant(10),
            )


def test_bans_hold_at_any_temperature():
    """PAD, BOS and an early EOS are banned at NEG_INF before the draw; tempering must not bring them within reach
    (divided by 1e8, -1e9 was -10: drawable beside tokens at -1e-8), nor a small temperature push every token
    past them."""
    from tf_transformer.decoding.beam_search import NEG_INF

    log_probs = tf.constant([[NEG_INF, NEG_INF, np.log(0.5), np.log(0.3), np.log(0.2)]], tf.float32)
    for temperature in (1e8, 100.0, 1.0, 1e-3, 1e-30):
        logits = np.asarray(filter_log_probs(log_probs, temperature=temperature))
        assert (logits[0, :2] == NEG_INF).all() and (logits[0, 2:] > NEG_INF / 2).any(), (temperature, logits)
        draws = tf.random.stateless_categorical(tf.repeat(logits, 200, axis=0), 1, seed=[1, 2])
        assert (draws.numpy() >= 2).all(), temperature


def test_filter_keeps_at_least_the_most_probable_token():
    log_probs = tf.math.log(tf.constant([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]]))
    kept = np.asarray(filter_log_probs(log_probs, top_p=0.5)) > -1e8
    np.testing.assert_array_equal(kept, [[True, False, False], [True, True, False]])
    kept = np.asarray(filter_log_probs(log_probs, top_k=2)) > -1e8
    np.testing.assert_array_equal(kept, [[True, True, False], [True, True, False]])


def test_options_equal_a_translator_built_with_those_settings(loaded, translator):
    """``translate_with_options`` (beam 8, α 1.0, 3-best: scalar tensors, a switch over compiled beams) gives what a
    translator built with beam 8 and α 1.0 gives when asked for 3: two paths to the same search."""
    got = options(loaded, SENTENCES, beam_size=8, alpha=1.0, nbest=3)
    built = translator.with_options(beam_size=8, alpha=1.0)
    expected = tf.function(lambda texts: built.translate(texts, DecodeRequest(nbest=3)))(tf.constant(SENTENCES))
    assert got["translations"].numpy().tolist() == expected["translations"].numpy().tolist()
    np.testing.assert_allclose(got["scores"].numpy(), expected["scores"].numpy(), atol=1e-5)
    assert len(set(got["translations"].numpy()[0].tolist())) == 3  # three different hypotheses, best first


def forced_search(translator, pieces):
    """The unconstrained search's ``(best ids, best scores)`` of the real sentences, and those of the search whose
    target prefix is the first ``pieces`` pieces of that best output (all of it but EOS: ``None``)."""
    source = translator.encode_strings(tf.constant([sentence for sentence in SENTENCES if sentence]))
    ids, scores, _ = translator.search(source)  # [batch, beam, len]
    best = np.asarray(ids)[:, 0]  # [batch, len]
    lengths = (best != PAD_ID).sum(axis=1)  # EOS counted
    ends = lengths - 1 if pieces is None else np.full_like(lengths, pieces)
    assert (lengths > ends).all()  # each prefix stops before EOS
    prefix = np.where(np.arange(best.shape[1])[None, :] < ends[:, None], best, PAD_ID)  # [batch, len]: 0-padded
    forced_ids, forced_scores, _ = translator.search(source, prefix_ids=prefix)
    forced = np.asarray(forced_ids)[:, 0]
    width = max(forced.shape[1], best.shape[1])
    pad = lambda a: np.pad(a, [(0, 0), (0, width - a.shape[1])])  # noqa: E731
    return (pad(best), np.asarray(scores)[:, 0]), (pad(forced), np.asarray(forced_scores)[:, 0]), prefix


@pytest.mark.parametrize("pieces", [1, 2, 4, None])
def test_a_prefix_of_the_best_greedy_output_gives_that_output_and_its_score(translator, pieces):
    """Beam 1: forcing the first ``pieces`` pieces of the unconstrained output leaves the search where it would
    have been, so it ends with that same output and score (the forced pieces scored as if chosen)."""
    (best, scores), (forced, forced_scores), _ = forced_search(translator.with_options(beam_size=1), pieces)
    np.testing.assert_array_equal(forced, best)
    np.testing.assert_allclose(forced_scores, scores, atol=1e-5)


@pytest.mark.parametrize("pieces", [1, 2, 4, None])
def test_a_prefix_of_the_best_beam_output_keeps_it_or_finds_a_better_one(translator, pieces):
    """Beam 4: the whole best output as a prefix gives it back with its score. A shorter prefix puts the whole
    beam on that prefix's continuations, which the unconstrained search pruned among others, so the search ends
    with the same output and score, or one with that prefix that scores higher (two pieces of this model's
    first sentence: -17.46 against -17.53), never a worse one."""
    (best, scores), (forced, forced_scores), prefix = forced_search(translator, pieces)
    assert (np.where(prefix != PAD_ID, forced[:, : prefix.shape[1]], PAD_ID) == prefix).all()  # starts with it
    same = (forced == best).all(axis=1)
    np.testing.assert_allclose(forced_scores[same], scores[same], atol=1e-5)
    assert (forced_scores[~same] > scores[~same]).all()
    if pieces is None:
        assert same.all()

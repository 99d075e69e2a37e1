"""Decoding only well-formed trees over the input (decoding/tree_constraint.py), on scripted models.

A scripted decoder's logits depend on the step only, so the unconstrained output is known: a malformed one
shows what the constraint changes, a valid one that it changes nothing.
"""

import numpy as np
import pytest
import tensorflow as tf
from nltk import Tree
from sentencepiece import sentencepiece_model_pb2

from tf_transformer.constants import EOS_ID, PAD_ID
from tf_transformer.decoding.beam_search import NEG_INF, beam_search
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.tree_constraint import TreeConstraint
from tf_transformer.tasks.parsing.linearization import repair

Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
SYMBOLS = ["(S", ")S", "(NP", ")NP", "(VP", ")VP", "XX", "(NNP)", "(VBD)", "(QP"]  # (QP has no closing
WORDS = ["▁John", "▁ran", "▁fa", "st", "er", "▁.", "▁Mary"]
PIECES = ["<pad>", "<unk>", "<s>", "</s>", *SYMBOLS, *WORDS]
ID = {piece: index for index, piece in enumerate(PIECES)}
VOCAB = len(PIECES)


def proto() -> bytes:
    model = sentencepiece_model_pb2.ModelProto()
    for index, piece in enumerate(PIECES):
        kind = Piece.CONTROL if index in (0, 2, 3) else Piece.UNKNOWN if index == 1 else Piece.NORMAL
        model.pieces.add(piece=piece, score=0.0, type=Piece.USER_DEFINED if piece in SYMBOLS else kind)
    return model.SerializeToString()


def ids(text: str) -> list[int]:
    return [ID[piece] for piece in text.split()]


def text(row) -> str:
    """Ids back as symbols and words (pieces joined), as the tokenizer's ``detokenize_target`` does."""
    pieces = [PIECES[i] for i in row if i not in (PAD_ID, EOS_ID)]
    return " ".join("".join(f" {p} " if p in SYMBOLS else p.replace("▁", " ") for p in pieces).split())


def source(*words: str) -> np.ndarray:
    """Source ids ``[batch, src_len]`` of space-separated pieces, EOS-terminated, 0-padded."""
    rows = [ids(line) + [EOS_ID] for line in words]
    width = max(map(len, rows))
    return np.array([row + [PAD_ID] * (width - len(row)) for row in rows], np.int32)


class ScriptedDecoding:
    """Stands for an :class:`~tf_transformer.decoding.incremental.IncrementalDecoder` whose logits at step
    ``s`` are ``script[s]`` for every row (past the script: EOS)."""

    def __init__(self, script):
        self.script = tf.constant(script, tf.float32)  # [steps, vocab]

    def logits(self, batch, step):
        eos = tf.one_hot(EOS_ID, VOCAB) * 10.0
        steps = tf.shape(self.script)[0]
        row = tf.cond(step < steps, lambda: self.script[tf.minimum(step, steps - 1)], lambda: eos)  # [vocab]
        return tf.tile(row[None], [batch, 1])

    def encode(self, inputs):
        return tf.zeros([tf.shape(inputs)[0], tf.shape(inputs)[1], 4]), None

    def constants(self, memory, weights=None, memory_mask=None):
        return []

    def empty_cache(self, batch, limit, dtype, beam_size=1):
        return {"rows": tf.zeros([batch * beam_size])}

    def first_step(self, ids, cache, constants, memory_mask):
        return self.logits(tf.shape(ids)[0], 0), cache

    def step(self, ids, cache, constants, memory_mask, step):
        return self.logits(tf.shape(ids)[0], step), cache


def script(tokens: str, noise: int = 0) -> np.ndarray:
    """Logits preferring ``tokens`` one per step (margin 5), with small random logits under them."""
    rng = np.random.default_rng(noise)
    table = rng.normal(0.0, 0.5, (len(tokens.split()) + 1, VOCAB)).astype(np.float32)
    for step, token in enumerate(tokens.split() + ["</s>"]):
        table[step, ID[token]] += 5.0
    return table


def greedy(inputs, table, scheme=None, max_extra_length=20):
    constraint = None if scheme is None else TreeConstraint(proto(), scheme, VOCAB)
    out = greedy_search(None, inputs, max_extra_length, decoding=ScriptedDecoding(table), constraint=constraint)
    return [text(row) for row in out.numpy()]


def beam(inputs, table, scheme=None, beam_size=3, nbest=3, max_extra_length=20):
    constraint = None if scheme is None else TreeConstraint(proto(), scheme, VOCAB)
    inputs = tf.constant(inputs)
    batch = inputs.shape[0]
    lengths = tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), axis=1) + max_extra_length
    decoding = ScriptedDecoding(table)

    def step_fn(tokens, cache, step):
        return tf.nn.log_softmax(decoding.logits(tf.shape(tokens)[0], step)), cache

    found, scores, _ = beam_search(
        step_fn,
        {"rows": tf.zeros([batch * beam_size])},
        batch,
        lengths,
        beam_size=beam_size,
        alpha=0.3,
        constraint=constraint,
        constraint_inputs=() if constraint is None else constraint.read_input(inputs),
    )
    return [[text(row) for row in rows[:nbest]] for rows in found.numpy()], scores.numpy()


def is_tree_over(output: str, words: list[str], scheme: str) -> bool:
    return repair(output.split(), words, scheme)[1].well_formed


VALID = "(S (NP ▁John )NP (VP ▁ran ▁fa st er )VP ▁. )S"
WORDS_OF = ["John", "ran", "faster", "."]


@pytest.mark.parametrize("search", [greedy, lambda i, t, s=None: [b[0] for b in beam(i, t, s)[0]]])
def test_a_valid_tree_is_decoded_the_same_with_and_without_the_constraint(search):
    inputs = source("▁John ▁ran ▁fa st er ▁.")
    table = script(VALID)
    assert search(inputs, table) == [text(ids(VALID))]
    assert search(inputs, table, "words") == search(inputs, table)


@pytest.mark.parametrize(
    "malformed",
    [
        "(S (NP ▁John )VP ▁ran ▁fast er )S )S",  # a wrong closing, a misspelt word, one closing too many
        "(S ▁John ▁. )S",  # words dropped
        "(S (NP ▁John ▁ran ▁fa (VP st er ▁. ▁. )VP",  # a bracket inside a word, a word repeated, never closed
        "(QP ▁John ▁ran ▁fa st er ▁. )S",  # an opening without a closing in the vocabulary
        ")S (S",  # a closing first
    ],
)
def test_a_malformed_output_becomes_a_tree_over_exactly_the_input_words(malformed):
    inputs = source("▁John ▁ran ▁fa st er ▁.", "▁Mary ▁ran")
    table = script(malformed.replace("▁fast", "▁fa"))
    unconstrained = greedy(inputs, table)
    assert not is_tree_over(unconstrained[0], WORDS_OF, "words")
    outputs = greedy(inputs, table, "words")
    found, scores = beam(inputs, table, "words", beam_size=4, nbest=4)
    for words, output, nbest, row_scores in zip([WORDS_OF, ["Mary", "ran"]], outputs, found, scores, strict=True):
        assert is_tree_over(output, words, "words"), output
        for hypothesis in nbest:
            assert is_tree_over(hypothesis, words, "words"), hypothesis
        assert np.all(row_scores > -1e8)


@pytest.mark.parametrize("scheme", ["xx", "tags"])
def test_under_placeholder_schemes_one_preterminal_per_input_word(scheme):
    inputs = source("▁John ▁ran ▁fa st er ▁.")
    table = script("(S XX XX XX XX XX XX )S (VBD)")
    outputs = greedy(inputs, table, scheme)
    assert is_tree_over(outputs[0], WORDS_OF, scheme), outputs
    leaves = [token for token in outputs[0].split() if token in ("XX", "(NNP)", "(VBD)")]
    assert len(leaves) == 4


def test_the_tree_ends_within_the_maximum_length():
    """Openings stop while there is room left to place every word and close every bracket."""
    inputs = source("▁John ▁ran ▁fa st er ▁.")  # 6 pieces and EOS
    table = script("(S " * 30)
    constraint = TreeConstraint(proto(), "words", VOCAB)
    for extra in (3, 5, 9):
        out = greedy_search(None, inputs, extra, decoding=ScriptedDecoding(table), constraint=constraint).numpy()
        assert is_tree_over(text(out[0]), WORDS_OF, "words"), (extra, text(out[0]))
        assert np.count_nonzero(out[0]) <= 7 + extra  # EOS counted
        found, _ = beam(inputs, table, "words", max_extra_length=extra)
        assert all(is_tree_over(h, WORDS_OF, "words") for h in found[0]), found


@pytest.mark.slow
def test_a_tiny_parser_decodes_trees_over_its_words_in_every_path(tiny_parser):
    """Beam search with n-best, greedy (dev F1), sampling, the export's signatures and the server's answers: a
    well-formed tree over exactly the input words, where the same model decoded unconstrained is not."""
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.decoding.request import DecodeRequest, Sampling
    from tf_transformer.inference.batch_translation import checkpoint_translate
    from tf_transformer.run_dir import restore_model
    from tf_transformer.serving.servable import Servable
    from tf_transformer.tasks import run_tokenizer
    from tf_transformer.tasks.parsing.treebank import read_trees
    from tf_transformer.training.dev_evaluation import translate_fn

    run, export, treebank = map(str, tiny_parser)
    lines = [" ".join(tree.leaves()) for tree in read_trees(f"{treebank}/wsj_0003.mrg")[:8]]

    def trees(outputs):
        return all(
            repair(output.split(), line.split(), "xx")[1].well_formed
            for line, output in zip(lines, outputs, strict=True)
        )

    assert DecodeOptions.for_run(run).tree == "xx"
    unconstrained = checkpoint_translate(run, options=DecodeOptions.for_run(run, constrained=False))(lines)
    assert not trees([nbest[0][0] for nbest in unconstrained])  # a tiny model: the free search writes no trees

    nbest = checkpoint_translate(run, DecodeRequest(beam_size=3, nbest=3))(lines)
    for rank in range(3):
        assert trees([hypotheses[rank][0] for hypotheses in nbest])
    sampled = checkpoint_translate(run, DecodeRequest(sampling=Sampling(temperature=1.5, seed=3)))(lines)
    assert trees([text for text, _ in sampled])
    model, config = restore_model(run)
    assert trees(translate_fn(model, run_tokenizer(run), config.max_extra_length, tree="xx")(lines))

    servable = Servable(export, 1)
    answer = servable.run("serving_default", lines)
    assert trees([text.decode() for text in answer["translations"]])
    assert [Tree.fromstring(tree.decode()).leaves() for tree in answer["trees"]] == [line.split() for line in lines]
    scalars = {"beam_size": 2, "nbest": 2, "alpha": 0.3, "min_length": 2, "max_extra_length": 10}
    options = servable.run("translate_with_options", lines, {"target_prefix": [""] * len(lines)}, scalars)
    for rank in range(2):
        assert trees([row[rank].decode() for row in options["translations"]])


def test_at_most_max_openings_constituents_open_in_a_row():
    from tf_transformer.decoding.tree_constraint import MAX_OPENINGS

    inputs = source("▁John ▁ran ▁fa st er ▁.")
    table = script("(S (NP (VP (S (NP (VP ▁John )VP )NP )S )VP )NP )S")  # six openings wanted before the first word
    for output in [greedy(inputs, table, "words")[0], *beam(inputs, table, "words", beam_size=4, nbest=4)[0][0]]:
        assert is_tree_over(output, WORDS_OF, "words"), output
        runs = "".join("(" if token.startswith("(") else " " for token in output.split()).split()
        assert max(map(len, runs)) <= MAX_OPENINGS, output
    assert greedy(inputs, table, "words")[0].startswith("(S (NP (VP John")


def test_a_source_without_words_ends_at_once_with_an_empty_output():
    """No tree exists over no words: the search does not run its sentence to the maximum length."""
    inputs = source("▁Mary ▁ran", "")
    table = script("(S ▁Mary ▁ran )S")
    assert greedy(inputs, table, "words") == ["(S Mary ran )S", ""]
    constraint = TreeConstraint(proto(), "words", VOCAB)
    decoding = ScriptedDecoding(table)

    def step_fn(tokens, cache, step):
        return tf.nn.log_softmax(decoding.logits(tf.shape(tokens)[0], step)), cache

    steps = []
    for rows in (inputs, inputs[:1]):
        found, _, ran = beam_search(
            step_fn,
            {"rows": tf.zeros([len(rows) * 3])},
            len(rows),
            tf.constant([12] * len(rows)),
            beam_size=3,
            constraint=constraint,
            constraint_inputs=constraint.read_input(tf.constant(rows)),
        )
        assert text(found.numpy()[0, 0]) == "(S Mary ran )S"
        steps.append(int(ran))
    assert text(found.numpy()[-1, 0]) == "" or len(found) == 1
    assert steps[0] == steps[1]  # the sentence with words alone decides when the search stops


def stepwise_allowed(constraint: TreeConstraint, target: list[int]) -> np.ndarray:
    """``bool[T, vocab]``: what the search allows after each prefix of ``target``, advanced one token at a time."""
    words = [t for t in target if t not in (EOS_ID, PAD_ID) and PIECES[t] not in SYMBOLS]
    if constraint.scheme != "words":
        words = [ID["▁John"]] * sum(constraint.leaves[t] for t in target)  # one word per preterminal
    sentences = constraint.read_input(tf.constant([words + [EOS_ID]], tf.int32))
    state = constraint.start(1, 1, len(target) + 1)
    rows = []
    for step, token in enumerate(target):
        rows.append(constraint.allowed(state, sentences, step, tf.constant([10_000]))[0, 0].numpy())
        state = constraint.advance(state, tf.constant([[token]], tf.int32))
    return np.stack(rows)


@pytest.mark.parametrize(
    "scheme, targets",
    [
        (
            "words",
            [
                "(S (NP ▁John )NP (VP ▁ran (NP ▁fa st er )NP )VP ▁. )S",
                "(S (NP (NP (NP ▁Mary )NP )NP )NP (VP ▁ran )VP )S",  # a 4th opening in a row: over the cap
            ],
        ),
        ("xx", ["(S (NP XX )NP (VP XX (NP XX XX )NP )VP )S", "(S XX XX )S"]),
        ("tags", ["(S (NP (NNP) )NP (VP (VBD) )VP )S"]),
    ],
)
def test_the_allowed_set_along_a_target_is_what_the_search_allows_after_each_prefix(scheme, targets):
    constraint = TreeConstraint(proto(), scheme, VOCAB)
    rows = [ids(target) + [EOS_ID] for target in targets]
    width = max(map(len, rows))
    along = constraint.allowed_along(tf.constant([row + [PAD_ID] * (width - len(row)) for row in rows])).numpy()
    for allowed, target in zip(along, rows, strict=True):  # [T, vocab] each
        np.testing.assert_array_equal(allowed[: len(target)], stepwise_allowed(constraint, target))
        refused = [t for t, token in enumerate(target) if not allowed[t, token]]
        assert refused == ([3] if target[:4] == ids("(S (NP (NP (NP") else [])


def test_a_vocabulary_of_bare_closings_closes_every_constituent_with_one():
    bare = ["(S", "(NP", "(VP", ")"]
    model = sentencepiece_model_pb2.ModelProto()
    for index, piece in enumerate(["<pad>", "<unk>", "<s>", "</s>", *bare, *WORDS]):
        kind = Piece.CONTROL if index in (0, 2, 3) else Piece.UNKNOWN if index == 1 else Piece.NORMAL
        model.pieces.add(piece=piece, score=0.0, type=Piece.USER_DEFINED if piece in bare else kind)
    constraint = TreeConstraint(model.SerializeToString(), "words", 4 + len(bare) + len(WORDS))
    assert list(np.flatnonzero(constraint.opens)) == [4, 5, 6] and set(constraint.closing_of[4:7]) == {7}
    target = [4, 5, 8 + WORDS.index("▁John"), 7, 6, 8 + WORDS.index("▁ran"), 7, 7, EOS_ID]  # (S (NP John ) (VP ran ) )
    allowed = constraint.allowed_along(tf.constant([target])).numpy()[0]
    assert all(allowed[t, token] for t, token in enumerate(target))
    assert not allowed[6, EOS_ID] and allowed[8, EOS_ID] and not allowed[8, 7]  # the root closes once, last


def test_renormalized_scores_are_a_softmax_over_the_allowed_tokens_and_greedy_picks_the_same():
    table = script("(S (NP ▁John )NP ▁ran ▁. )S", noise=3)
    inputs = source("▁John ▁ran ▁.")
    plain = TreeConstraint(proto(), "words", VOCAB)
    renormalized = TreeConstraint(proto(), "words", VOCAB, renormalize=True)
    sentences = plain.read_input(tf.constant(inputs))
    state = plain.start(1, 1, 16)
    log_probs = tf.nn.log_softmax(tf.constant(table[:1][None]))  # [1, 1, vocab]
    allowed = plain.allowed(state, sentences, 0, tf.constant([16])).numpy()
    scores = renormalized.constrain(log_probs, state, sentences, 0, tf.constant([16])).numpy()
    assert np.exp(scores[allowed]).sum() == pytest.approx(1.0, rel=1e-5) and (scores[~allowed] <= -1e8).all()
    found = greedy_search(None, inputs, 20, decoding=ScriptedDecoding(table), constraint=renormalized)
    assert [text(row) for row in found.numpy()] == greedy(inputs, table, "words")


@pytest.mark.parametrize("renormalize", [False, True])
def test_a_target_prefix_keeps_its_score_under_the_constraint_and_a_malformed_one_gets_no_output(renormalize):
    """The prefix is forced after the constraint: renormalized or not, a forced token scores what the
    constrained search gives it, and a prefix the constraint refuses leaves the sentence no hypothesis."""
    constraint = TreeConstraint(proto(), "words", VOCAB, renormalize=renormalize)
    table = script("(S (NP ▁John )NP ▁ran ▁. )S", noise=4)
    inputs = tf.constant(source("▁John ▁ran ▁.", "▁John ▁ran ▁."))
    decoding = ScriptedDecoding(table)

    def step_fn(tokens, cache, step):
        return tf.nn.log_softmax(decoding.logits(tf.shape(tokens)[0], step)), cache

    prefixes = tf.constant([ids("(S (VP"), ids("(S )S")], tf.int32)  # the second closes a constituent without words
    found, scores, _ = beam_search(
        step_fn,
        {"rows": tf.zeros([2 * 3])},
        2,
        tf.constant([20, 20]),
        beam_size=3,
        alpha=0.0,
        forced_ids=prefixes,
        constraint=constraint,
        constraint_inputs=constraint.read_input(inputs),
    )
    best = found.numpy()[0, 0]
    assert text(best).startswith("(S (VP John") and is_tree_over(text(best), ["John", "ran", "."], "words")
    expected, state = 0.0, constraint.start(1, 1, 20)  # the constrained log-probabilities of the best output
    sentences = constraint.read_input(inputs[:1])
    for step, token in enumerate(t for t in best if t != PAD_ID):
        row = tf.nn.log_softmax(tf.constant(table[min(step, len(table) - 1)][None, None]))
        if step >= len(table):
            row = tf.nn.log_softmax(tf.one_hot(EOS_ID, VOCAB)[None, None] * 10.0)
        expected += float(constraint.constrain(row, state, sentences, step, tf.constant([20]))[0, 0, token])
        state = constraint.advance(state, tf.constant([[token]]))
    assert scores.numpy()[0, 0] == pytest.approx(expected, abs=1e-3)
    assert text(found.numpy()[1, 0]) == "" and scores.numpy()[1, 0] <= NEG_INF / 2


@pytest.mark.parametrize("renormalize", [False, True])
def test_a_parser_scores_its_search_outputs_as_the_search_scored_them(tiny_parser, renormalize):
    """``score`` (tft-score, the export's ``score``) gives the constrained search's own scores back, with the
    softmax over the allowed tokens where the search renormalizes."""
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.inference.translator import Translator
    from tf_transformer.run_dir import restore_model
    from tf_transformer.tasks import run_tokenizer
    from tf_transformer.tasks.parsing.treebank import read_trees

    run, _, treebank = map(str, tiny_parser)
    lines = tf.constant([" ".join(tree.leaves()) for tree in read_trees(f"{treebank}/wsj_0003.mrg")[:6]])
    model, _ = restore_model(run)
    options = DecodeOptions.for_run(run, renormalize=renormalize)
    translator = Translator(model, run_tokenizer(run), options.replace(alpha=0.0))
    outputs = translator.translate(lines)
    scored = translator.score(lines, outputs["translations"])
    np.testing.assert_allclose(np.asarray(scored["scores"]), np.asarray(outputs["scores"]), atol=2e-4)


def test_only_a_bare_closing_symbol_closes_for_an_opening_without_its_own():
    """A text piece spelled ``)`` is no closing: ``(QP``, whose ``)QP`` the vocabulary lacks, stays no opening."""
    model = sentencepiece_model_pb2.ModelProto.FromString(proto())
    model.pieces.add(piece=")", score=0.0, type=Piece.NORMAL)
    constraint = TreeConstraint(model.SerializeToString(), "words", VOCAB + 1)
    assert not constraint.opens[ID["(QP"]] and constraint.opens[ID["(NP"]]

"""Scoring given (source, target) pairs with an export (its ``score`` signature) or a run's checkpoint."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tf_transformer.inference.batch_translation import _translate_batches


@dataclasses.dataclass(frozen=True)
class PairScore:
    """One pair's score (:func:`~tf_transformer.decoding.scoring.score_ids`).

    ``log_prob``: the target's log-probability, the sum of ``token_log_probs``
    (one per target token, EOS last); ``length``: the tokens, EOS counted.
    """

    log_prob: float
    length: int
    token_log_probs: tuple[float, ...]

    def normalized(self, alpha: float) -> float:
        """``log_prob`` divided by GNMT's length penalty ``((5 + length) / 6) ** alpha``: beam search's score."""
        return self.log_prob / ((5.0 + self.length) / 6.0) ** alpha


def _scores(outputs) -> list[PairScore]:
    """The rows of a scoring call's outputs (``log_probs``, ``lengths``, ``token_log_probs``)."""
    log_probs, lengths = outputs["log_probs"].numpy(), outputs["lengths"].numpy()
    tokens = outputs["token_log_probs"].numpy()
    return [
        PairScore(float(log_prob), int(length), tuple(float(value) for value in tokens[row, :length]))
        for row, (log_prob, length) in enumerate(zip(log_probs, lengths, strict=True))
    ]


def export_scorer(model_path: str) -> Callable[[list[tuple[str, str]]], list[PairScore]]:
    """``score(batch of (source, target)) → [PairScore, …]`` with the export's ``score`` signature."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    signatures = tf.saved_model.load(model_path).signatures
    if "score" not in signatures:
        raise ValueError(f"{model_path} has no score signature: export it again with this version's tft-export")
    serving = signatures["score"]

    def score(batch):
        sources, targets = zip(*batch, strict=True)
        return _scores(serving(inputs=tf.constant(sources), targets=tf.constant(targets)))

    return score


def checkpoint_scorer(model_dir: str, checkpoint: str | None = None) -> Callable[[list[tuple[str, str]]], list]:
    """``score(batch of (source, target)) → [PairScore, …]`` with a run's checkpoint."""
    import tensorflow as tf

    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.inference.translator import Translator
    from tf_transformer.run_dir import restore_model
    from tf_transformer.tasks import run_tokenizer

    model, _ = restore_model(model_dir, checkpoint)
    translator = Translator(model, run_tokenizer(model_dir), DecodeOptions.for_run(model_dir))
    run = tf.function(translator.score, reduce_retracing=True)

    def score(batch):
        sources, targets = zip(*batch, strict=True)
        return _scores(run(tf.constant(sources), tf.constant(targets)))

    return score


def score_pairs(
    score: Callable[[list], list[PairScore]], pairs: list[tuple[str, str]], batch_size: int = 64, progress=None
) -> list[PairScore]:
    """``score``'s result for each of ``pairs``, in input order; batched by source length."""
    return _translate_batches(pairs, batch_size, score, 1, progress)

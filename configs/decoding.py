"""The decoding settings: each one's default and range, defined once.

Section 6.1 decodes with a beam of 4 and a length penalty α = 0.6, outputs at
most input length + 50; sampling (temperature, top-k, top-p, a seed) is the
toolkit's addition. Every place that takes one of these settings reads it here:
the run config's and :class:`~tf_transformer.decoding.decode_options.DecodeOptions`'
defaults, :class:`~tf_transformer.decoding.request.DecodeRequest`'s checks (the
command line's, ``tft-serve``'s), the command-line flags' bounds and the export's
request-time signatures (their scalar inputs' dtypes and in-graph checks). Plain
Python: a server reads it without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Setting:
    """One decoding setting.

    Args:
      name: the field, flag and signature input name.
      dtype: the dtype of the export's scalar input (``int32``, ``int64``, ``float32``).
      default: the value when nothing else sets it (a run's config may set its own).
      minimum: the smallest allowed value (``None``: none).
      maximum: the largest allowed value (``None``: none here; a model may bound it).
      open_minimum: ``minimum`` itself is not allowed (a temperature must be positive).
      ceiling: for a setting without a natural maximum, the largest value taken: far beyond any useful
        value, it refuses infinity and values whose arithmetic would overflow float32 or make the
        bans on PAD, BOS and an early EOS drawable.
      help: what it does, for ``--help`` and error messages.
      group: ``"Decoding"`` (beam search) or ``"Sampling"``: the word its errors start with.
    """

    name: str
    dtype: str
    default: int | float
    minimum: int | float | None
    maximum: int | float | None = None
    open_minimum: bool = False
    ceiling: int | float | None = None
    help: str = ""
    group: str = "Decoding"

    @property
    def is_integer(self) -> bool:
        return self.dtype.startswith("int")

    def requirement(self) -> str:
        """The allowed range in words, after "must": ``"be at least 1"``, ``"not be negative"``, …"""
        if self.maximum is not None:
            return f"be in {'(' if self.open_minimum else '['}{self.minimum}, {self.maximum}]"
        if self.minimum == 0:
            return "be positive" if self.open_minimum else "not be negative"
        return f"be at least {self.minimum}"

    def violation(self, value) -> str | None:
        """Why ``value`` is outside the range (a sentence naming the setting), or ``None``."""
        if self.is_integer and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{self.group} option {self.name} must be an integer, got {value!r}"
        if not self.is_integer and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"{self.group} option {self.name} must be a number, got {value!r}"
        low, high = self.minimum, self.maximum
        below = low is not None and (value <= low if self.open_minimum else value < low)
        if below or (high is not None and value > high) or (isinstance(value, float) and math.isnan(value)):
            return f"{self.group} option {self.name} must {self.requirement()}, got {value}"
        if self.ceiling is not None and value > self.ceiling:
            return f"{self.group} option {self.name} must be at most {self.ceiling}, got {value}"
        return None


_SETTINGS = (
    Setting("beam_size", "int32", 4, 1, help="Beam size K (section 6.1: 4)."),
    Setting(
        "alpha",
        "float32",
        0.6,
        0,
        ceiling=10.0,
        help="Length penalty α of ((5 + length) / 6)^α (section 6.1: 0.6; 0: none).",
    ),
    Setting("nbest", "int32", 1, 1, help="Hypotheses per input, best first (at most the beam size)."),
    Setting("min_length", "int32", 2, 0, help="No EOS before this many output tokens, EOS counted (2: never first)."),
    Setting("max_extra_length", "int32", 50, 0, help="Longest output = input length + this, EOS counted (6.1: 50)."),
    Setting(
        "temperature",
        "float32",
        1.0,
        0,
        open_minimum=True,
        ceiling=100.0,
        group="Sampling",
        help="Divide log-probs by this.",
    ),
    Setting("top_k", "int32", 0, 0, group="Sampling", help="Draw among the k most probable tokens (0: all)."),
    Setting(
        "top_p", "float32", 1.0, 0, 1, open_minimum=True, group="Sampling", help="Then among the fewest reaching p."
    ),
    Setting("seed", "int64", 1, None, group="Sampling", help="The draws' seed: same seed, same input, same output."),
)

SETTINGS: dict[str, Setting] = {setting.name: setting for setting in _SETTINGS}

# What a beam-search request sets (the ``translate_with_options`` signature's scalars, in its order) and what a
# sampling request sets (``sample``'s, with ``max_extra_length``).
SEARCH_SETTINGS = ("beam_size", "alpha", "nbest", "min_length", "max_extra_length")
SAMPLING_SETTINGS = ("seed", "temperature", "top_k", "top_p", "max_extra_length")
# The settings a model has its own value of (its run config, what its export fixed): a request leaves them unset.
MODEL_SETTINGS = ("beam_size", "alpha", "min_length", "max_extra_length")
# The settings of the draws themselves (:class:`~tf_transformer.decoding.request.Sampling`).
DRAW_SETTINGS = ("seed", "temperature", "top_k", "top_p")

# When a sentence's beam search ends before its longest output (section 6.1: "terminate early when
# possible"), the default first:
# - "finished": once K hypotheses have ended among the K best continuations of their steps
#   (fairseq's rule, CTranslate2's with a length penalty, Hugging Face's early_stopping=True);
# - "exact": once no live hypothesis can still beat the K finished ones at any length up to the
#   maximum (Hugging Face's early_stopping="never"): the K best of every length, at more steps;
# - "best": once the best continuation of a step ended and the n-best asked have (OpenNMT-py's
#   "top beam finished"): the fewest steps.
EARLY_STOPS = ("finished", "exact", "best")

# Section 6.3's parsing: "a beam size of 21 and α = 0.3", "maximum output length to input length + 300".
PARSING_DECODING = dict(beam_size=21, alpha=0.3, max_extra_length=300)

# The ways a parser writes a tree as target symbols (section 6.3; docs/parsing.md#trees-as-sequences): the
# linearizations whose well-formed trees a constrained search can keep to (``DecodeOptions.tree``).
TREE_LINEARIZATIONS = ("xx", "tags", "words")
# How a graph may split raw source text into words before SentencePiece: a parser's export takes raw English
# text as the Penn Treebank tokenizes it (docs/parsing.md#raw-text).
WORD_TOKENIZERS = ("penn",)

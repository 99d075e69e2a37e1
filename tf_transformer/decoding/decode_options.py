"""The decoding settings of a translation: beam, length penalty, length limits, batch parts.

One frozen :class:`DecodeOptions` is built from a run's config and the command
line's flags (:meth:`DecodeOptions.from_config`, the one place where the config's
defaults are filled in) and passed whole to the
:class:`~tf_transformer.inference.translator.Translator`, the export (which records
it in ``assets.extra/tf_transformer.json``), batch translation and the attention
report. Plain Python: a server reads an export's options without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from configs.decoding import EARLY_STOPS, MODEL_SETTINGS, SETTINGS, TREE_LINEARIZATIONS, WORD_TOKENIZERS

# The beam sizes an export's options signature compiles in besides its own (:meth:`DecodeOptions.beam_sizes`):
# the search builds its beam into its shapes, so a request picks one of a fixed set.
BEAM_SIZES = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How beam search decodes (section 6.1), and the limits an export enforces.

    Args:
      beam_size: K (4 in the paper); for greedy search see :mod:`tf_transformer.decoding.greedy`.
      alpha: the GNMT length penalty's exponent α (0.6 in the paper; 0: none).
      max_extra_length: each output is at most its input's length + this many tokens,
        EOS counted (50 in the paper).
      min_length: no EOS before this many output tokens (EOS counted; 0: none). The
        default 2 keeps EOS from coming first, so a non-empty source never gets an
        empty output (fairseq's ``min_len`` 1, which does not count EOS).
      max_output_length: a cap on the output length besides input + ``max_extra_length``
        (EOS counted; raised to ``min_length`` where smaller; ``None``: none).
        ``min_length == max_output_length`` fixes the length, which makes speed
        comparisons do equal work.
      batch_parts: split every batch into this many equal parts, each searched by its
        own loop in the same graph; TensorFlow's executor runs the loops side by
        side on its inter-op threads (CTranslate2's ``inter_threads``). Meant for
        CPUs run with ``intra_op_parallelism_threads=1`` and
        ``inter_op_parallelism_threads=batch_parts``: a decoding step is hundreds of
        small ops, and each then runs whole on one core instead of being split
        across the cores op by op (docs/design/decoding.md). Translations are
        one search's, up to float rounding (the products see fewer rows).
      max_source_length: the longest source a search accepts, in tokens with EOS
        (``None``: any). Self-attention's memory grows with the square of the
        source length and the decoder's cache with source + ``max_extra_length``,
        so a server needs this bound: one very long sentence must not exhaust it.
        A longer source fails the call with ``InvalidArgumentError`` naming the
        limit, unless ``truncate_source``: then it is cut to its first
        ``max_source_length - 1`` tokens and EOS.
      truncate_source: see ``max_source_length``.
      early_stop: when a sentence's search ends before its longest output (section 6.1:
        "terminate early when possible"): ``"finished"`` once K hypotheses have ended
        among the K best continuations of their steps (fairseq's and CTranslate2's rule),
        ``"exact"`` once no live hypothesis can beat the K finished ones at any length
        (:func:`~tf_transformer.decoding.beam_search.sentence_done`; docs/design/decoding.md
        measures both).
      tree: a parser's linearization (:data:`~configs.decoding.TREE_LINEARIZATIONS`) whose
        well-formed trees over the input words every output must be: the search only
        takes tokens that keep to one (section 6.3; docs/parsing.md#constrained-decoding).
        ``None``: any sequence (translation, or a parser decoded unconstrained).
      renormalize: with ``tree``, each step's log-probabilities are renormalized over the
        tokens the constraint allows, as the softmax of a parser trained with
        ``--tree_loss allowed`` was (its full softmax means nothing there); ``False``: the
        model's own (docs/parsing.md#training-as-it-decodes).
      word_tokenizer: how a source string is split into words before its pieces
        (:data:`~configs.decoding.WORD_TOKENIZERS`): ``"penn"``, the Penn Treebank's
        tokenization of raw English (a parser's export, docs/parsing.md#raw-text);
        ``None``: the string is taken as it is.
    """

    beam_size: int = SETTINGS["beam_size"].default
    alpha: float = SETTINGS["alpha"].default
    max_extra_length: int = SETTINGS["max_extra_length"].default
    min_length: int = SETTINGS["min_length"].default
    max_output_length: int | None = None
    batch_parts: int = 1
    max_source_length: int | None = None
    truncate_source: bool = False
    early_stop: str = EARLY_STOPS[0]
    tree: str | None = None
    renormalize: bool = False
    word_tokenizer: str | None = None

    def __post_init__(self):
        # Only what a search cannot run without; the ranges a caller may ask for are configs.decoding's.
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be positive, got {self.beam_size}")
        if self.max_output_length is not None and self.max_output_length < 1:
            raise ValueError(f"max_output_length must be positive, got {self.max_output_length}")
        if self.batch_parts < 1:
            raise ValueError(f"batch_parts must be positive, got {self.batch_parts}")
        if self.max_source_length is not None and self.max_source_length < 2:
            raise ValueError(f"max_source_length must be at least 2 (a token and EOS), got {self.max_source_length}")
        if self.early_stop not in EARLY_STOPS:
            raise ValueError(f"early_stop must be one of {', '.join(EARLY_STOPS)}, got {self.early_stop!r}")
        if self.tree is not None and self.tree not in TREE_LINEARIZATIONS:
            raise ValueError(f"tree must be one of {', '.join(TREE_LINEARIZATIONS)} or None, got {self.tree!r}")
        if self.renormalize and self.tree is None:
            raise ValueError("renormalize applies to a parser's constrained search: give a tree")
        if self.word_tokenizer is not None and self.word_tokenizer not in WORD_TOKENIZERS:
            raise ValueError(
                f"word_tokenizer must be one of {', '.join(WORD_TOKENIZERS)} or None, got {self.word_tokenizer!r}"
            )
        if self.truncate_source and self.max_source_length is None:
            raise ValueError("truncate_source needs a max_source_length")

    @classmethod
    def from_config(cls, config, **flags: Any) -> DecodeOptions:
        """The options of a run with ``config`` (a :class:`~configs.TransformerConfig`), ``flags`` applied.

        A flag that is ``None`` was not given: beam size, α and ``max_extra_length``
        then come from the config, the others keep their defaults here. An unknown
        flag name raises ``TypeError``.
        """
        values = {"beam_size": config.beam_size, "alpha": config.alpha, "max_extra_length": config.max_extra_length}
        values.update({name: value for name, value in flags.items() if value is not None})
        return cls(**values)

    @classmethod
    def for_run(cls, model_dir: str, constrained: bool = True, **flags: Any) -> DecodeOptions:
        """:meth:`from_config` with the config of the training run in ``model_dir``.

        A parser's run decodes well-formed trees of its linearization (its task's
        :attr:`~tf_transformer.tasks.Task.tree`) unless ``constrained`` is false,
        renormalized over the allowed tokens where it trained over them.
        """
        from tf_transformer.run_dir import load_run
        from tf_transformer.tasks import get_task

        config, run = load_run(model_dir)
        if constrained and flags.get("tree") is None:
            flags["tree"] = get_task(run.get("task"), run.get("linearization")).tree
            if flags["tree"] and flags.get("renormalize") is None:
                flags["renormalize"] = run.get("tree_loss") == "allowed"
        return cls.from_config(config, **flags)

    def replace(self, **changes: Any) -> DecodeOptions:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON values, by field name (what an export records)."""
        return dataclasses.asdict(self)

    def merged(self, request) -> DecodeOptions:
        """These options with the beam size, α and lengths a ``request``
        (:class:`~tf_transformer.decoding.request.DecodeRequest`) sets: a translator
        built for that request, as a run directory decodes (an export's options
        are fixed, and a request is checked against them instead)."""
        return self.replace(
            **{name: getattr(request, name) for name in MODEL_SETTINGS if getattr(request, name) is not None}
        )

    def beam_sizes(self) -> list[int]:
        """The beam sizes a request may choose in an export with these options: its own and :data:`BEAM_SIZES`."""
        return sorted({*BEAM_SIZES, self.beam_size})

    def longest_output(self, source_length, request=None, prefix_length=None, minimum=min, maximum=max):
        """The most tokens (EOS counted) a source of ``source_length`` tokens (with EOS) may produce.

        ``request`` (a :class:`~tf_transformer.decoding.request.DecodeRequest`)
        may change ``max_extra_length`` and ``min_length``; an output with a
        target prefix of ``prefix_length`` tokens has room for it and one more
        (EOS). The search sets this bound per sentence in its graph, with
        ``int32[batch]`` lengths and ``minimum=tf.minimum, maximum=tf.maximum``;
        a server computes it in Python.
        """
        extra, min_length = self.max_extra_length, self.min_length
        if request is not None:
            extra = extra if request.max_extra_length is None else request.max_extra_length
            min_length = min_length if request.min_length is None else request.min_length
        longest = source_length + extra
        if self.max_output_length is not None:
            longest = minimum(longest, self.max_output_length)
        if prefix_length is not None:
            longest = maximum(longest, prefix_length + 1)
        if not isinstance(min_length, int) or min_length:  # a tensor, or a positive int
            longest = maximum(longest, min_length)
        return longest

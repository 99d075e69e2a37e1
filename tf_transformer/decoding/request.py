"""What one call may set of a decoding: one frozen value, passed whole from the flag or HTTP body to the search.

A :class:`DecodeRequest` says what a call changes of a model's
:class:`~tf_transformer.decoding.decode_options.DecodeOptions` (beam size, α,
n-best, lengths, target prefixes) or that it samples (:class:`Sampling`). Each
setting's default and range are :data:`configs.decoding.SETTINGS`'; what a
model adds to them (the beam sizes an export compiled, its longest output) is
:meth:`DecodeRequest.limits`, which the Python checks here (the command line's,
``tft-serve``'s) and the exported graph's assertions
(:class:`~tf_transformer.inference.translator.Translator`) both evaluate, so a
request is refused with the same words wherever it is. Plain Python: a server
checks a request without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

from configs.decoding import DRAW_SETTINGS, MODEL_SETTINGS, SAMPLING_SETTINGS, SEARCH_SETTINGS, SETTINGS


class RequestError(ValueError):
    """A decoding request out of range; ``setting`` names the setting at fault."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


def _check(name: str, value) -> None:
    """``value`` of setting ``name`` within its range, or a :class:`RequestError` naming it. A tensor (a
    graph's request) is left to the graph's checks of :meth:`DecodeRequest.limits`."""
    if not isinstance(value, int | float | str | type(None)):
        return
    if (why := SETTINGS[name].violation(value)) is not None:
        raise RequestError(name, why)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How :mod:`~tf_transformer.decoding.sampling` draws each next token, instead of a beam search.

    Args:
      temperature: the log-probabilities are divided by this (below 1: sharper; above: flatter).
      top_k: draw among the ``top_k`` most probable tokens only (0: all).
      top_p: then among the fewest most probable whose probability sums to ``top_p`` (1: all).
      seed: the draws' seed; the same seed and input give the same outputs.
    """

    temperature: float = SETTINGS["temperature"].default
    top_k: int = SETTINGS["top_k"].default
    top_p: float = SETTINGS["top_p"].default
    seed: int = SETTINGS["seed"].default

    def __post_init__(self):
        for field in dataclasses.fields(self):
            _check(field.name, getattr(self, field.name))

    def batch_seed(self, lines) -> int:
        """The seed of one batch of ``lines``: ``seed`` mixed with their text.

        Batches with the same seed would otherwise draw from the same random
        stream; mixed with the text, each batch draws its own, whatever the
        order batches run in (several workers) or how many there are.
        """
        digest = zlib.crc32("\n".join(map(str, lines)).encode("utf-8"))
        return (self.seed * 1_000_003 + digest) % (2**63)


@dataclasses.dataclass(frozen=True)
class Limit:
    """One bound on a request's setting: ``setting op bound`` must hold.

    ``op`` is ``">="``, ``">"``, ``"<="`` or ``"in"``; ``bound`` a number, the
    allowed values (``"in"``) or the name of another setting of the request.
    ``requirement`` says it in words, after "must".
    """

    setting: str
    op: str
    bound: Any
    requirement: str

    @property
    def message(self) -> str:
        return f"{SETTINGS[self.setting].group} option {self.setting} must {self.requirement}"

    def holds(self, value, bound) -> bool:
        """Whether ``value`` meets ``bound`` (``bound`` resolved when it names a setting)."""
        if self.op == "in":
            return value in bound
        return {">=": value >= bound, ">": value > bound, "<=": value <= bound}[self.op]


@dataclasses.dataclass(frozen=True)
class DecodeRequest:
    """What one call sets of a decoding; ``None`` keeps the model's own (its :class:`DecodeOptions`).

    Args:
      beam_size: K (a Python int: the search builds it into its shapes; an export
        takes one of :meth:`DecodeOptions.beam_sizes`).
      alpha: the length penalty's α.
      nbest: hypotheses returned per input, best first (at most the beam size).
      min_length: no EOS before this many output tokens (EOS counted).
      max_extra_length: each output at most its input's length + this (at most the model's).
      prefix: each input comes with a target prefix its outputs start with
        (lines are ``(source, prefix)`` pairs; docs/inference.md#target-prefixes).
      sampling: draw one output per input (:class:`Sampling`) instead of a beam
        search; it takes ``max_extra_length`` and none of the beam's settings.

    Inside a graph, ``alpha``, ``nbest``, ``min_length`` and ``max_extra_length``
    may be scalar tensors (one graph serves any value); they are then checked by
    the graph (:meth:`limits`), Python values here and against a model by :meth:`check`.
    """

    beam_size: int | None = None
    alpha: float | None = None
    nbest: int = 1
    min_length: int | None = None
    max_extra_length: int | None = None
    prefix: bool = False
    sampling: Sampling | None = None

    def __post_init__(self):
        for name in SEARCH_SETTINGS:
            if getattr(self, name) is not None:
                _check(name, getattr(self, name))
        if self.sampling is not None:
            beam = [name for name in ("beam_size", "alpha", "min_length") if getattr(self, name) is not None]
            beam += ["nbest"] * (self.nbest != 1) + ["prefix"] * self.prefix
            if beam:
                raise RequestError(
                    beam[0],
                    f"Sampling draws one output per input: it takes no {', '.join(beam)} "
                    "(only max_extra_length of the search's settings)",
                )
        elif isinstance(self.nbest, int) and isinstance(self.beam_size, int) and self.nbest > self.beam_size:
            raise RequestError("nbest", f"Decoding option nbest must be at most beam_size, got {self.nbest}")

    @classmethod
    def from_settings(cls, values: dict[str, Any]) -> DecodeRequest:
        """The request of ``values`` by setting name (flags, an HTTP body's scalars): sampling's settings
        (``seed``, ``temperature``, ``top_k``, ``top_p``), if any, make a sampling request."""
        sampling = {name: values[name] for name in DRAW_SETTINGS if name in values}
        rest = {name: value for name, value in values.items() if name not in sampling}
        unknown = sorted(set(rest) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"DecodeRequest has no setting {', '.join(unknown)}")
        return cls(**rest, sampling=Sampling(**sampling) if sampling else None)

    def is_default(self) -> bool:
        """Whether this request changes nothing: the model's own beam search, its best output only."""
        return self == DecodeRequest()

    def replace(self, **changes: Any) -> DecodeRequest:
        return dataclasses.replace(self, **changes)

    def resolved(self, options) -> DecodeRequest:
        """This request with every setting it leaves to the model taken from ``options`` (:class:`DecodeOptions`)."""
        names = MODEL_SETTINGS if self.sampling is None else ("max_extra_length",)
        own = {name: getattr(options, name) for name in names}
        return self.replace(**{name: value for name, value in own.items() if getattr(self, name) is None})

    def settings(self) -> tuple[str, ...]:
        """The settings this request takes: a beam search's, or sampling's."""
        return SAMPLING_SETTINGS if self.sampling is not None else SEARCH_SETTINGS

    def values(self, options) -> dict[str, Any]:
        """Every setting of :meth:`settings`, resolved against ``options``: an export signature's scalars."""
        resolved = self.resolved(options)
        sampling = {}
        if self.sampling is not None:
            sampling = {name: getattr(self.sampling, name) for name in DRAW_SETTINGS}
        return {name: sampling[name] if name in sampling else getattr(resolved, name) for name in self.settings()}

    def limits(self, options, compiled_beams: bool = True) -> list[Limit]:
        """Every bound on :meth:`settings` for a model decoding with ``options``: each setting's range
        (:data:`configs.decoding.SETTINGS`), then what the model adds: the beam sizes an export compiled
        (unless not ``compiled_beams``: a model decoded in-process takes any), n-best within the beam, its
        longest extra length (its cache's bound), a minimum length it can reach."""
        found = []
        for name in self.settings():
            setting = SETTINGS[name]
            if setting.minimum is not None:
                op = ">" if setting.open_minimum else ">="
                found.append(Limit(name, op, setting.minimum, setting.requirement()))
            if setting.maximum is not None:
                found.append(Limit(name, "<=", setting.maximum, setting.requirement()))
            if setting.ceiling is not None:
                found.append(Limit(name, "<=", setting.ceiling, f"be at most {setting.ceiling}"))
        most = options.max_extra_length
        found.append(Limit("max_extra_length", "<=", most, f"be at most {most}, this model's most"))
        if self.sampling is None:
            if compiled_beams:
                sizes = options.beam_sizes()
                found.append(Limit("beam_size", "in", sizes, f"be one of {', '.join(map(str, sizes))}"))
            found.append(Limit("nbest", "<=", "beam_size", "be at most beam_size"))
            if options.max_source_length is not None:
                longest = options.max_source_length + options.max_extra_length
                found.append(Limit("min_length", "<=", longest, f"be at most {longest}"))
        return found

    def check(self, options, compiled_beams: bool = True) -> DecodeRequest:
        """This request resolved against a model's ``options``, or a :class:`RequestError` naming the setting
        (``compiled_beams``: see :meth:`limits`)."""
        values = self.values(options)
        for limit in self.limits(options, compiled_beams):
            value = values[limit.setting]
            bound = values[limit.bound] if isinstance(limit.bound, str) else limit.bound
            if not limit.holds(value, bound):
                raise RequestError(limit.setting, f"{limit.message}, got {value}")
        return self.resolved(options)

"""Speed side by side with the toolkits users would pick instead: the systems and their interface.

    pip install -e '.[bench]'     # keras-hub, transformers, torch (CPU), ctranslate2, tokenizers
    python -m benchmarks.peers --size small --size base

The command (``__main__``) measures every system on one workload (:mod:`.workload`)
in one process, interleaved. Each system is a module offering the :class:`System`
functions, registered by its ``--systems`` name in :data:`SYSTEMS`:

- ``ours`` (:mod:`.ours`): our presets, trained through Keras ``fit`` with the paper's
  loss and optimizer; decoding through the exported SavedModel;
- ``keras_hub`` (:mod:`.keras_hub`): the same architecture from ``keras_hub.layers`` (training);
- ``hf`` (:mod:`.huggingface`): Hugging Face ``MarianMTModel`` on PyTorch (training, ``generate``);
- ``ct2`` (:mod:`.ct2`): that Marian model converted for CTranslate2 (decoding).

A system module is imported only when asked for, and imports its toolkit only when it
builds something, so this package and ``--help`` load without the optional peers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np

from benchmarks.peers.workload import DecodingWorkload

__all__ = [
    "SAVED_DECODERS",
    "SYSTEMS",
    "DecodeRun",
    "DecodingWorkload",
    "SavedDecoder",
    "System",
    "Training",
    "saved_decoder",
    "system",
]

DecodeRun = Callable[[list[int]], object]
"""``run(group)``: decodes ``batches[i]`` for each index ``i`` of ``group``, returning once the ids exist."""


class Training(NamedTuple):
    """One training setting of a system, built and warmed up."""

    run: Callable[[int], list[float]]  # run(steps): wall-clock seconds of each of `steps` optimizer steps
    figures: dict  # "params"; with "flops_per_step" and "peak_key" (float32 / bfloat16), its MFU is reported


class System(Protocol):
    """What the command needs of a system. Result names start with the system's name
    (``ours_float32``, ``ct2_int8_workers2``, …); an empty dict means "not measured here"."""

    def train_runners(self, size: str) -> dict[str, Training]:
        """Its training settings at the ``size`` preset's dimensions, each on the workload's identical batch."""
        ...

    def decode_runners(self, size: str, workload: DecodingWorkload) -> dict[str, DecodeRun]:
        """Its ways of decoding ``workload.batches`` at ``size`` (precisions, ways of using ``--threads``)."""
        ...


class SavedDecoder(Protocol):
    """A system whose decoder a separate process can load (``ours``, ``ct2``): ``profiling.step_breakdown``."""

    def save_decoder(self, size: str, workload: DecodingWorkload) -> str:
        """Its float32 decoder at ``size`` written under ``workload.work``; returns the directory."""
        ...

    def load_decoder(self, path: str, batches: list[np.ndarray]) -> Callable[[int], None]:
        """``run(i)``: the decoder at ``path`` decodes ``batches[i]`` (in ``--batch_parts``), checking the length."""
        ...


# --systems name -> module, in the order systems are built and interleaved.
SYSTEMS = {"ours": "ours", "keras_hub": "keras_hub", "hf": "huggingface", "ct2": "ct2"}
SAVED_DECODERS = ("ours", "ct2")  # the systems that are also SavedDecoders


def system(name: str) -> System:
    """The system registered as ``name`` (a module of this package, imported now)."""
    return importlib.import_module(f"{__name__}.{SYSTEMS[name]}")


def saved_decoder(name: str) -> SavedDecoder:
    """The system ``name`` as a :class:`SavedDecoder` (one of :data:`SAVED_DECODERS`)."""
    if name not in SAVED_DECODERS:
        raise KeyError(f"{name}: not a SavedDecoder (those are {', '.join(SAVED_DECODERS)})")
    return importlib.import_module(f"{__name__}.{SYSTEMS[name]}")

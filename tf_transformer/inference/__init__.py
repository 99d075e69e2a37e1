"""Everything after training: search, the decoding cache, the exported module, export, batch translation.

Imports nothing from :mod:`tf_transformer.training`; training uses
:func:`greedy_search` (dev BLEU) and :class:`IncrementalDecoder` from here, and
nothing else. The names below load their module on first use, so that a
command-line entry point can parse its flags before TensorFlow starts.
"""

import importlib

_EXPORTS = {
    "DecodeOptions": "decode_options",
    "IncrementalDecoder": "incremental",
    "Translator": "translator",
    "beam_search": "beam_search",
    "export_run": "export",
    "export_translator": "export",
    "greedy_search": "greedy",
    "inference_copy": "precision",
    "length_penalty": "beam_search",
    "translate_lines": "batch_translation",
    "translate_with_checkpoint": "batch_translation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"tf_transformer.inference.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'tf_transformer.inference' has no attribute {name!r}")

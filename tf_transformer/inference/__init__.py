"""The drivers of decoding: the exported translator, and translating or scoring many lines from Python.

:class:`Translator` puts tokenization, the search (:mod:`tf_transformer.decoding`)
and detokenization in one graph: it is what an export holds and what a run
directory decodes with. :mod:`.batch_translation` and :mod:`.batch_scoring`
feed it (or a loaded export) sentences in length-sorted batches and streams
(what one translation attended to is drawn by :mod:`tf_transformer.attention_views`). Nothing here
writes artifacts (:mod:`tf_transformer.exporting`) or serves requests
(:mod:`tf_transformer.serving`). The names below load their module on first use,
so that a command-line entry point can parse its flags before TensorFlow starts.
"""

from tf_transformer import lazy_attributes

_EXPORTS = {
    "Translator": "translator",
    "translate_lines": "batch_translation",
    "translate_with_checkpoint": "batch_translation",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)

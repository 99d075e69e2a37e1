"""The artifacts a trained run becomes: a SavedModel for TF Serving, its metadata, a CTranslate2 model.

:mod:`.saved_model` writes the :class:`~tf_transformer.inference.translator.Translator`
as a string-in, string-out SavedModel in TF Serving's layout; :mod:`.export_info`
reads and writes what an export records beside its graph (its decoding options,
its limits), in plain Python, so that servers and batch tools read an export
without loading it; :mod:`.ctranslate2` writes a run's weights in CTranslate2's
format. The importing side, models trained elsewhere, is
:mod:`tf_transformer.importing`. The names below load their module on first use.
"""

from tf_transformer import lazy_attributes

_EXPORTS = {
    "export_run": "saved_model",
    "export_translator": "saved_model",
    "read_export_info": "export_info",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)

"""The search engine: everything that runs inside a decoding graph.

The decoder's cache and its kernels laid out for one row per hypothesis
(:mod:`.incremental`, :mod:`.cache`, :mod:`.cached_attention`, :mod:`.kernels`,
:mod:`.packing`), the searches that drive them (beam search, section 6.1;
greedy search; sampling) with their top-k and length penalty, teacher-forced
scoring, and the two plain values a caller
decodes with: :class:`DecodeOptions` (fixed for a translator's life, recorded
by an export) and :class:`DecodeRequest` (what one call changes of them, or
:class:`Sampling`). Nothing
here reads files or knows of exports, servers or training; training's dev BLEU
and :mod:`tf_transformer.inference` use it. The names below load their module
on first use, so that a command-line entry point or a server can read the
two plain values without starting TensorFlow.
"""

from tf_transformer import lazy_attributes

_EXPORTS = {
    "DecodeOptions": "decode_options",
    "DecodeRequest": "request",
    "IncrementalDecoder": "incremental",
    "Sampling": "request",
    "beam_search": "beam_search",
    "greedy_search": "greedy",
    "inference_copy": "precision",
    "length_penalty": "beam_search",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)

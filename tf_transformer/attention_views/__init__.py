"""Views of attention: what a model attended to, as weights, word alignments, figures and reports.

The search never reads these; they read a model and what it translated.
:mod:`.maps` runs a teacher-forced pass over one translation and keeps every
layer's weights with the tokens on each axis (the paper's figures 3–5);
:mod:`.alignment` turns one decoder layer's encoder–decoder weights into word
alignments, in Python and in the exported graph (``translate_with_alignment``);
:mod:`.figures` draws weights with matplotlib (training's TensorBoard images,
``tft-attention``); :mod:`.report` is what ``tft-attention`` writes, from a run
directory or an export. The weights come from the model's own attention layers
(:meth:`~tf_transformer.model.Transformer.attention_weights`). Submodules are
imported by name: the figures need matplotlib, the report a translator.
"""

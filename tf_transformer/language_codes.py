"""Language codes at the start of a source, as multilingual OPUS-MT models take them (``>>deu<<``).

A model trained on several target languages reads which one to write from a
piece such as ``>>deu<<`` at the start of the source, a piece of its vocabulary
that no SentencePiece segmentation produces. Marian's tokenizer in transformers
takes the text from ``>>`` to the first ``<<`` as that piece and segments the
rest; :class:`pipelines.vocab.Tokenizer` does the same in the graph, and a
server counting a source's tokens in Python does it here. A light module: the
server reads exports without Keras or TensorFlow's data modules.
"""

from __future__ import annotations

# A language code at the start of a source: ">>" up to the first "<<" (as a regular expression, for the graph).
LANGUAGE_CODE = ">>.*?<<"


def split_language_code(text: str) -> tuple[str | None, str]:
    """``(code, rest)`` of a source with a leading language code, else ``(None, text)``."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return text[: end + 2], text[end + 2 :]
    return None, text


def has_language_codes(proto: bytes) -> bool:
    """Whether the SentencePiece model ``proto`` holds language-code pieces such as ``>>deu<<``."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    return any(p.piece.startswith(">>") and p.piece.endswith("<<") and len(p.piece) > 4 for p in model.pieces)

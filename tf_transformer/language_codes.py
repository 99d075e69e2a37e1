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


class SourcePieces:
    """A source's segmentation in Python as the graph does it (:class:`pipelines.vocab.Tokenizer`), for the
    servers' length checks and the attention report: SentencePiece, and a leading language code as one piece
    where the model holds codes."""

    def __init__(self, proto: bytes):
        import sentencepiece as spm

        self.processor = spm.SentencePieceProcessor(model_proto=proto)
        self.language_codes = has_language_codes(proto)

    @classmethod
    def from_file(cls, path: str) -> SourcePieces:
        with open(path, "rb") as handle:
            return cls(handle.read())

    def encode(self, text: str, out_type: type = int) -> list:
        """``text``'s pieces (``out_type=str``) or ids, without EOS."""
        code, rest = split_language_code(text) if self.language_codes else (None, text)
        pieces = self.processor.encode(rest, out_type=out_type)
        if code is None:
            return pieces
        return [code if out_type is str else self.processor.piece_to_id(code), *pieces]

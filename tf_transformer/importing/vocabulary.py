"""An OPUS-MT vocabulary as ours: one id map (``vocab.json``) over two SentencePiece models.

A Marian model segments the source with ``source.spm`` and the target with
``target.spm``, and numbers the pieces of both with one map, ``vocab.json``,
whose ids index the embedding. Ours fixes padding 0, UNK 1, BOS 2, EOS 3
(:mod:`tf_transformer.constants`) and tokenizes in the graph with the
SentencePiece op, whose ids are its model's piece numbers. So the import
renumbers: it writes each SentencePiece model again with its pieces in our id
order (``sp.model``, ``sp.target.model``), and the embedding rows move with
them (:attr:`IdMap.rows`).

- Padding, UNK and EOS are the map's ``<pad>``, ``<unk>`` and ``</s>``.
- BOS is the decoder's first input. Marian starts its decoder from a zero
  vector (Hugging Face's port: the pad id, whose row is zero); ours gets a row
  of its own, zero, and the config's ``zero_bos_embedding`` keeps it so.
- A piece of the map that a model lacks is kept as ``UNUSED``: never produced by
  that side's segmentation, as in Marian.
- A piece of a model that the map lacks is kept after the map's ids; the
  tokenizer turns it into UNK (:func:`pipelines.vocab.vocabulary_size`), as
  Marian's lookup does.
"""

from __future__ import annotations

import dataclasses
import json

from tf_transformer.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID

PAD_PIECE, UNK_PIECE, BOS_PIECE, EOS_PIECE = "<pad>", "<unk>", "<s>", "</s>"


class VocabularyError(ValueError):
    """A vocabulary the import cannot use, with the file and the reason."""


@dataclasses.dataclass(frozen=True)
class IdMap:
    """Our ids for a Marian vocabulary.

    Attributes:
      pieces: our id → its piece.
      rows: our id → the Marian id whose embedding row it takes, or ``None`` (a zero row: BOS).
    """

    pieces: tuple[str, ...]
    rows: tuple[int | None, ...]

    @property
    def size(self) -> int:
        return len(self.pieces)

    def ours(self) -> dict[int, int]:
        """Marian id → our id."""
        return {row: ours for ours, row in enumerate(self.rows) if row is not None}


def read_vocab_json(path: str) -> dict[str, int]:
    """``vocab.json`` (Hugging Face's layout): piece → id, ids ``0 … n−1`` each once."""
    try:
        with open(path, encoding="utf-8") as handle:
            vocab = json.load(handle)
    except FileNotFoundError:
        raise VocabularyError(f"{path} not found") from None
    except (OSError, json.JSONDecodeError) as error:
        raise VocabularyError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise VocabularyError(f"{path}: expected an object mapping each piece to its id")
    return _numbered(vocab, path)


def read_vocab_yml(path: str) -> dict[str, int]:
    """A Marian vocabulary (``*.vocab.yml``): one ``piece: id`` a line, ids ``0 … n−1`` each once.

    Read a line at a time rather than as one YAML document: a whole-document load would turn pieces such
    as ``<<`` (a merge key) or ``null`` into something else, and let a repeated piece hide another.
    """
    import yaml

    vocab: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                key, _, value = line.rpartition(":")
                try:
                    piece = yaml.load(key, Loader=yaml.BaseLoader) if key.startswith(('"', "'")) else key
                    index = int(value)
                except (ValueError, yaml.YAMLError):
                    raise VocabularyError(f"{path}, line {number}: expected 'piece: id', got {line!r}") from None
                if not isinstance(piece, str) or not piece:
                    raise VocabularyError(f"{path}, line {number}: expected 'piece: id', got {line!r}")
                if piece in vocab:
                    raise VocabularyError(f"{path}, line {number}: the piece {piece!r} is there twice")
                vocab[piece] = index
    except FileNotFoundError:
        raise VocabularyError(f"{path} not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise VocabularyError(f"{path}: cannot read it ({error})") from None
    return _numbered(vocab, path)


def _numbered(vocab: dict[str, int], path: str) -> dict[str, int]:
    if not vocab or sorted(vocab.values()) != list(range(len(vocab))):
        raise VocabularyError(f"{path}: the ids are not 0 … {len(vocab) - 1}, each once")
    return vocab


def id_map(vocab: dict[str, int], path: str, pad_id: int, eos_id: int) -> IdMap:
    """Our ids for ``vocab`` (``path`` names it in errors), whose padding and EOS ids are ``pad_id``, ``eos_id``."""
    by_id = {i: piece for piece, i in vocab.items()}
    if by_id.get(pad_id) is None or by_id.get(eos_id) is None:
        raise VocabularyError(f"{path}: has no piece with the model's pad id {pad_id} or EOS id {eos_id}")
    if UNK_PIECE not in vocab:
        raise VocabularyError(f"{path}: has no {UNK_PIECE} piece")
    special = {PAD_ID: pad_id, UNK_ID: vocab[UNK_PIECE], BOS_ID: vocab.get(BOS_PIECE), EOS_ID: eos_id}
    pieces = [PAD_PIECE, UNK_PIECE, BOS_PIECE, EOS_PIECE]
    rows: list[int | None] = [special[i] for i in range(4)]
    taken = {row for row in rows if row is not None}
    for marian_id in range(len(vocab)):
        if marian_id not in taken:
            pieces.append(by_id[marian_id])
            rows.append(marian_id)
    return IdMap(tuple(pieces), tuple(rows))


def renumbered_model(proto: bytes, ids: IdMap, path: str) -> bytes:
    """The SentencePiece model ``proto`` (read from ``path``) with its pieces in our id order (see the module)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    piece_type = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
    if model.trainer_spec.model_type not in (1, 2):  # UNIGRAM, BPE: the segmentations whose pieces carry scores
        raise VocabularyError(f"{path}: a {model.trainer_spec.model_type} model; only unigram and BPE are supported")
    own = {p.piece: p for p in model.pieces if p.type in (piece_type.NORMAL, piece_type.USER_DEFINED, piece_type.BYTE)}
    special = {
        PAD_ID: piece_type.CONTROL,
        UNK_ID: piece_type.UNKNOWN,
        BOS_ID: piece_type.CONTROL,
        EOS_ID: piece_type.CONTROL,
    }
    renumbered = []
    for ours, piece in enumerate(ids.pieces):
        entry = sentencepiece_model_pb2.ModelProto.SentencePiece(piece=piece, score=0.0)
        if ours in special:
            entry.type = special[ours]
        elif piece in own:
            entry.type, entry.score = own[piece].type, own[piece].score
        else:
            entry.type = piece_type.UNUSED  # the other side's piece: never produced by this model
        renumbered.append(entry)
    known = set(ids.pieces)
    renumbered += [own[piece] for piece in own if piece not in known]  # past the map: tokenized as UNK
    del model.pieces[:]
    model.pieces.extend(renumbered)
    spec = model.trainer_spec
    spec.vocab_size = ids.size
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    spec.pad_piece, spec.unk_piece, spec.bos_piece, spec.eos_piece = PAD_PIECE, UNK_PIECE, BOS_PIECE, EOS_PIECE
    return model.SerializeToString()

"""What ``tft-attention`` writes: a sentence's translation and figures of its attention.

From a training run (:func:`run_attention`): beam search translates each sentence,
a teacher-forced pass over the best hypothesis keeps every layer's weights
(:func:`~tf_transformer.attention_views.maps.attention_maps`), and
:func:`write_figures` draws them: a grid of heads for every layer of the three
kinds of attention, and figures 3–5 of the paper (encoder self-attention, one
layer, one token).

From an export (:func:`export_attention`) only what the
``translate_with_alignment`` signature returns can be drawn: one decoder layer's
encoder–decoder attention, heads averaged, and its word alignment.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from tf_transformer.attention_views.figures import head_grid, save_png, token_lines, two_heads
from tf_transformer.attention_views.maps import (
    KINDS,
    SPECIAL,
    AttentionMaps,
    hypothesis_length,
    merge_pieces,
    words_of,
)
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.request import DecodeRequest
from tf_transformer.language_codes import SourcePieces

UNITS_NOTE = {
    "pieces": "SentencePiece pieces",
    "words": "words: a word's pieces summed as keys, averaged as queries",
}
AXES = {
    "encoder": ("source token attending", "source token attended to"),
    "decoder": ("target token being predicted", "decoder input attended to (<s> first)"),
    "cross": ("target token being predicted", "source token attended to"),
}


def farthest_token(weights: np.ndarray, tokens: Sequence[str]) -> int:
    """The token whose attention, heads averaged, reaches farthest on average (``weights [heads, n, n]``).

    Figure 3 picks a token with a long-distance dependency; this finds one without
    knowing the language. Only tokens with a letter are candidates (not ``</s>``
    or punctuation) while the sentence has any.
    """
    mean = np.asarray(weights, np.float64).mean(axis=0)  # [n, n]
    n = mean.shape[0]
    distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])  # [n, n]
    reach = (mean * distance).sum(axis=1)  # [n]: expected distance attended over
    wordlike = np.array([token not in SPECIAL and any(c.isalpha() for c in token) for token in tokens])
    return int(np.argmax(np.where(wordlike, reach, -1.0))) if wordlike.any() else 0


def sharpest_heads(weights: np.ndarray, query: int) -> tuple[int, int]:
    """The two heads that attend most sharply from ``query`` (highest largest weight), for figures 4–5."""
    peaks = np.asarray(weights)[:, query, :].max(axis=1)  # [heads]
    order = np.argsort(-peaks, kind="stable")
    return (int(order[0]), int(order[1] if len(order) > 1 else order[0]))


def find_token(tokens: Sequence[str], token: str) -> int:
    """``token`` as an index into ``tokens``: a number, or a token's text (its first occurrence, "▁" ignored)."""
    if token.lstrip("-").isdigit():
        index = int(token)
        if not -len(tokens) <= index < len(tokens):
            raise ValueError(f"--token {token}: the sentence has {len(tokens)} tokens (0 to {len(tokens) - 1})")
        return index % len(tokens)
    plain = [candidate.replace("\u2581", "") for candidate in tokens]
    if token.replace("\u2581", "") in plain:
        return plain.index(token.replace("\u2581", ""))
    raise ValueError(f"--token {token!r} is not in the sentence; its tokens are {' '.join(tokens)}")


def choose(
    maps: AttentionMaps, layer: int, token: str | None, heads: tuple[int, int] | None
) -> tuple[int, tuple[int, int]]:
    """The token and the two heads figures 3–4 show (see :func:`write_figures`); a ``ValueError`` names a wrong one."""
    num_layers, num_heads = maps.encoder.shape[:2]
    if not 0 <= layer < num_layers:
        raise ValueError(f"--layer {layer}: the model has layers 0 to {num_layers - 1}")
    if heads is not None and not all(0 <= head < num_heads for head in heads):
        raise ValueError(f"--heads {heads}: the model has heads 0 to {num_heads - 1}")
    weights = maps.encoder[layer]  # [heads, source, source]
    query = farthest_token(weights, maps.source) if token is None else find_token(maps.source, token)
    return query, heads or sharpest_heads(weights, query)


def write_figures(
    maps: AttentionMaps,
    output: str,
    layer: int,
    token: str | None = None,
    heads: tuple[int, int] | None = None,
) -> dict:
    """Draws ``maps`` into ``output`` (a directory, made if missing); returns what was drawn.

    Writes ``{encoder,decoder,cross}_layer{L}.png`` for every layer (L from 1, as
    the paper counts), ``figure3_layer{L}.png`` (what one token attends to in every
    head of the encoder's layer ``layer``, from 0) and ``figure4_layer{L}.png`` (two
    heads in full, then that token's attention in both). ``token``: which token
    (index or text; default :func:`farthest_token`); ``heads``: which two (default
    :func:`sharpest_heads`).
    """
    query, heads = choose(maps, layer, token, heads)
    num_layers = maps.encoder.shape[0]
    os.makedirs(output, exist_ok=True)
    unit = UNITS_NOTE[maps.unit]
    files = []
    for kind, name in KINDS.items():
        weights, queries, keys = maps.kind(kind)
        rows, columns = AXES[kind]
        for index in range(num_layers):
            path = os.path.join(output, f"{kind}_layer{index + 1}.png")
            title = f"{name}, layer {index + 1} of {num_layers} ({unit})\nrows: {rows}; columns: {columns}"
            save_png(head_grid(weights[index], queries, keys, title), path)
            files.append(path)

    weights = maps.encoder[layer]  # [heads, source, source]
    where = f"encoder self-attention, layer {layer + 1} of {num_layers} ({unit})"
    figure3 = os.path.join(output, f"figure3_layer{layer + 1}.png")
    save_png(token_lines(weights, maps.source, maps.source, query, f"'{maps.source[query]}': {where}"), figure3)
    figure4 = os.path.join(output, f"figure4_layer{layer + 1}.png")
    save_png(two_heads(weights, maps.source, maps.source, heads, query, where), figure4)
    files += [figure3, figure4]
    return {
        "layer": layer,
        "token": query,
        "token_text": maps.source[query],
        "heads": list(heads),
        "unit": maps.unit,
        "source_tokens": maps.source,
        "target_tokens": maps.target,
        "figures": [os.path.basename(path) for path in files],
    }


def run_attention(
    model_dir: str,
    sentences: Sequence[str],
    checkpoint: str | None = None,
    request: DecodeRequest | None = None,
) -> list[tuple[str, str, AttentionMaps]]:
    """``(source, translation, maps)`` for each sentence with a run's checkpoint (beam search, then every weight).

    ``request``: what the search changes of the run's options
    (:class:`~tf_transformer.decoding.request.DecodeRequest`: beam size, α, lengths).
    """
    import tensorflow as tf

    from tf_transformer.attention_views.maps import attention_maps
    from tf_transformer.inference.translator import Translator
    from tf_transformer.run_dir import restore_model
    from tf_transformer.tasks import run_tokenizer

    model, config = restore_model(model_dir, checkpoint)
    tokenizer = run_tokenizer(model_dir)
    request = request or DecodeRequest()
    translator = Translator(model, tokenizer, DecodeOptions.from_config(config).merged(request))
    piece = tokenizer.python_processor().id_to_piece
    results = []
    for sentence in sentences:
        source = translator.encode_strings(tf.constant([sentence]))  # [1, src_len]
        ids, _, _ = translator.search(source)  # [1, beam, out_len]
        best = ids[0, 0].numpy()
        target = best[: hypothesis_length(best)]  # up to and with EOS
        text = tokenizer.detokenize_target(tf.constant([target])).numpy()[0].decode("utf-8")
        results.append((sentence, text, attention_maps(model, source[0].numpy(), target, piece)))
    return results


def export_attention(model_path: str, sentences: Sequence[str]) -> tuple[int, list[dict]]:
    """The export's ``translate_with_alignment`` outputs per sentence, with the tokens of both sides.

    Returns ``(layer, results)``: the decoder layer the export aligns with (from 0)
    and, per sentence, its ``source``, ``translation``, ``alignment`` (``"i-j …"``),
    ``source_tokens``, ``target_tokens`` and ``attention [target, source]``. The rows
    are labelled with the translation's own ids, which the signature returns; the
    source is tokenized as the graph does, with the export's ``assets/sp.model``.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from tf_transformer.exporting.export_info import read_export_info

    info = read_export_info(model_path)
    if "translate_with_alignment" not in info.signatures:
        raise ValueError(
            f"{model_path} has no translate_with_alignment signature: export it again (tft-export adds it by default), "
            "or give --model_dir for every layer and head"
        )
    signature = tf.saved_model.load(model_path).signatures["translate_with_alignment"]
    if "ids" not in signature.structured_outputs:
        raise ValueError(f"{model_path}: its translate_with_alignment signature returns no ids; export it again")
    pieces = SourcePieces.from_file(os.path.join(model_path, "assets", "sp.model"))
    processor = pieces.processor
    results = []
    for sentence in sentences:
        outputs = signature(inputs=tf.constant([sentence]))
        ids = outputs["ids"].numpy()[0]
        target = [processor.id_to_piece(int(i)) for i in ids[: hypothesis_length(ids)]]
        source = [*pieces.encode(sentence.strip(), out_type=str), "</s>"]  # as the graph segments it
        attention = outputs["attention"].numpy()[0]  # [out_len, src_len], padded
        if attention.shape[1] < len(source):  # a source the export cut (--truncate_source)
            raise ValueError(
                f"{model_path}: the export cut {sentence!r} to {attention.shape[1]} of its {len(source)} tokens"
            )
        results.append(
            {
                "source": sentence,
                "translation": outputs["translations"].numpy()[0].decode("utf-8"),
                "alignment": outputs["alignments"].numpy()[0].decode("utf-8"),
                "source_tokens": source,
                "target_tokens": target,
                "attention": attention[: len(target), : len(source)],
            }
        )
    return info.alignment_layer, results


def write_export_figure(result: dict, layer: int, output: str, words: bool = False) -> dict:
    """Draws one :func:`export_attention` result: ``cross_layer{L}_mean.png``, heads averaged."""
    os.makedirs(output, exist_ok=True)
    source, target, attention = result["source_tokens"], result["target_tokens"], result["attention"]
    unit = "pieces"
    if words:
        attention = merge_pieces(attention, source, target)
        source, target, unit = words_of(source), words_of(target), "words"
    path = os.path.join(output, f"cross_layer{layer + 1}_mean.png")
    title = (
        f"encoder-decoder attention, layer {layer + 1}, heads averaged ({UNITS_NOTE[unit]})\n"
        f"rows: {AXES['cross'][0]}; columns: {AXES['cross'][1]}; alignment {result['alignment']}"
    )
    save_png(head_grid(attention[None], target, source, title, panel_titles=["heads averaged"]), path)
    return {
        "layer": layer,
        "unit": unit,
        "alignment": result["alignment"],
        "source_tokens": source,
        "target_tokens": target,
        "figures": [os.path.basename(path)],
    }

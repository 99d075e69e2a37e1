"""Which decoder layer's attention aligns words best (a benchmark, not a test), measured against IBM models.

    python -m benchmarks.alignment --model_dir runs/multi30k_en_de

The export aligns words with one decoder layer's encoder–decoder attention, heads
averaged (docs/inference.md, Alignments). With no gold word alignments for the
corpus, the reference is a statistical aligner: an IBM model (``--ibm_model``, 1
or 2, from ``nltk.translate``) trained in both directions on the training split
(``--ibm_pairs`` of it, all by default) together with the test split's sentence
pairs, as is usual for unsupervised aligners. The links both directions agree on
(the intersection) are the "sure" links S, high in precision and lower in recall.

Every decoder layer then aligns each test pair teacher-forced over the
*reference* translation, so all layers see the same pairs
(:func:`~tf_transformer.attention_views.alignment.hypothesis_attention`, then
:func:`~tf_transformer.attention_views.alignment.word_alignment`: each target word to
the source word it attends to most, pieces merged into words, EOS left out as the
export does). Words are SentencePiece words, a "▁" piece starting one, i.e. the
whitespace-separated tokens of the raw text with punctuation attached; the IBM
models see the same tokens, lowercased and with punctuation stripped from their
edges ("beach." → "beach", "." stays "."), so word ``i`` is the same on both
sides. Pairs whose count of SentencePiece words differs from that of whitespace
tokens (an ``<unk>`` piece is a word of its own) are left out and counted
(``pairs_skipped``).

For each layer, with A its links (one per target word): ``precision`` = |A∩S|/|A|,
``recall`` = |A∩S|/|S|, ``aer`` = 1 − 2|A∩S|/(|A|+|S|) (Och and Ney's AER with
S = P = the intersection); ``aer_union`` takes P = the union of both directions
instead (S still the intersection). ``diagonal``, the floor, aligns target word j
of n to source word round(j·m/n) of m (capped at m − 1). ``layer_<k>_shifted``
reads the rows one step later, whose decoder input is the word rather than its
prediction (Chen et al. 2020's Shift-Att). Counts are summed over the test split
before dividing. ``--show`` prints a few pairs' links to check by eye. The last
line is one JSON object.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "runs/multi30k_en_de", "Run directory (tft-train output).")
flags.DEFINE_string("checkpoint", None, "Checkpoint to load (default: the run's averaged or newest).")
flags.DEFINE_string("data", "../shared/data/multi30k", "Corpus directory ({split}.{src} / {split}.{tgt}).")
flags.DEFINE_string("src", "en", "Source language.")
flags.DEFINE_string("tgt", "de", "Target language.")
flags.DEFINE_string("train", "train", "Split the IBM models are trained on (with the test split).")
flags.DEFINE_string("test", "test_2016_flickr", "Split aligned and scored.")
flags.DEFINE_enum("ibm_model", "2", ["1", "2"], "IBM model 1 (lexical) or 2 (lexical and positional).")
flags.DEFINE_integer("ibm_iterations", 5, "EM iterations (model 2 starts from 2× as many of model 1, as nltk does).")
flags.DEFINE_integer("ibm_pairs", 0, "IBM training pairs, the first of the split (0: all).", lower_bound=0)
flags.DEFINE_integer("batch", 64, "Sentence pairs per teacher-forced pass.", lower_bound=1)
flags.DEFINE_integer("show", 3, "Test pairs whose links are printed, to check by eye.", lower_bound=0)

EDGE_PUNCTUATION = re.compile(r"^[^\w]+|[^\w]+$")


def ibm_words(line: str) -> list[str]:
    """The whitespace-separated tokens of ``line`` (SentencePiece's words), lowercased, edge punctuation stripped."""
    words = []
    for token in line.lower().split():
        words.append(EDGE_PUNCTUATION.sub("", token) or token)  # a token of punctuation alone stays itself
    return words


def ibm_links(model: str, iterations: int, targets: list, sources: list, keep: int) -> tuple[list, float]:
    """Trains ``IBMModel<model>`` to generate ``targets`` from ``sources``.

    Returns the Viterbi links of the last ``keep`` pairs and the training time:
    ``([{(source word, target word)}] per kept pair, NULL links left out; seconds)``.
    """
    from nltk.translate import AlignedSent, IBMModel1, IBMModel2

    corpus = [AlignedSent(target, source) for target, source in zip(targets, sources, strict=True)]
    start = time.perf_counter()
    (IBMModel1 if model == "1" else IBMModel2)(corpus, iterations)  # aligns the corpus it was trained on
    seconds = time.perf_counter() - start
    kept = corpus[len(corpus) - keep :]
    return [{(i, j) for j, i in pair.alignment if i is not None} for pair in kept], seconds


def diagonal(source_words: int, target_words: int) -> set:
    """Target word j of n → source word round(j·m/n) of m, at most m − 1."""
    return {(min(int(j * source_words / target_words + 0.5), source_words - 1), j) for j in range(target_words)}


def scores(links: list[set], sure: list[set], possible: list[set]) -> dict:
    """Precision, recall and AER of ``links`` against ``sure`` (S = P), and AER with P = ``possible``; summed counts."""
    found = sum(len(a) for a in links)
    wanted = sum(len(s) for s in sure)
    hits = sum(len(a & s) for a, s in zip(links, sure, strict=True))
    possible_hits = sum(len(a & p) for a, p in zip(links, possible, strict=True))
    return {
        "precision": round(hits / found, 4),
        "recall": round(hits / wanted, 4),
        "aer": round(1 - 2 * hits / (found + wanted), 4),
        "precision_union": round(possible_hits / found, 4),
        "aer_union": round(1 - (hits + possible_hits) / (found + wanted), 4),
    }


def attention_links(model, processor, sources: list[str], targets: list[str], layers: int) -> tuple[dict, list]:
    """Each layer's word links of every pair, teacher-forced over ``targets``, and the pairs whose words match.

    Returns ``({name: [{(source word, target word)}] per kept pair}, kept pair indices)``, with
    names ``layer_<k>`` (the export's rule: the rows of the steps that predict a word's pieces)
    and ``layer_<k>_shifted`` (the rows one step later, whose decoder input is the piece).
    """
    from tf_transformer.attention_views.alignment import hypothesis_attention, word_alignment
    from tf_transformer.attention_views.maps import word_index
    from tf_transformer.constants import EOS_ID, PAD_ID

    def encode(line):  # ids without EOS, their pieces, and whether the pieces' words are the whitespace tokens
        ids = processor.encode(line)
        pieces = [processor.id_to_piece(i) for i in ids]
        words = int(word_index(pieces)[-1]) + 1 if pieces else 0
        return ids, pieces, words == len(line.split())

    def padded(rows):  # int32[batch, longest + 1]: each row's ids, EOS, 0-padding
        out = np.full([len(rows), max(len(r) for r in rows) + 1], PAD_ID, np.int32)
        for k, row in enumerate(rows):
            out[k, : len(row) + 1] = [*row, EOS_ID]
        return out

    encoded = [(encode(s), encode(t)) for s, t in zip(sources, targets, strict=True)]
    kept = [k for k, ((_, _, s_ok), (_, _, t_ok)) in enumerate(encoded) if s_ok and t_ok]
    links = {f"layer_{layer}{kind}": [] for layer in range(layers) for kind in ("", "_shifted")}
    for start in range(0, len(kept), FLAGS.batch):
        batch = [encoded[k] for k in kept[start : start + FLAGS.batch]]
        source_ids = padded([s[0] for s, _ in batch])  # [batch, src_len]
        target_ids = padded([t[0] for _, t in batch])  # [batch, tgt_len]
        for layer in range(layers):
            attention = hypothesis_attention(model, source_ids, target_ids, layer).numpy()  # [batch, tgt, src]
            for row, ((_, s_pieces, _), (_, t_pieces, _)) in enumerate(batch):
                rows = attention[row, : len(t_pieces) + 1, : len(s_pieces)]  # EOS row kept, EOS column left out
                links[f"layer_{layer}"].append(set(word_alignment(rows[:-1], s_pieces, t_pieces)))
                links[f"layer_{layer}_shifted"].append(set(word_alignment(rows[1:], s_pieces, t_pieces)))
    return links, kept


def show(source: str, target: str, named: dict) -> None:
    """Prints each set of links as ``target word→source word`` pairs in target order."""
    s_words, t_words = source.split(), target.split()
    print(f"\n{source}\n{target}")
    for name, links in named.items():
        pairs = " ".join(f"{t_words[j]}→{s_words[i]}" for i, j in sorted(links, key=lambda link: link[1]))
        print(f"  {name:>8}: {pairs}")


def main(argv):
    del argv
    import tensorflow as tf

    import pipelines
    from benchmarks.common import machine
    from tf_transformer.run_dir import default_checkpoint, restore_model, vocabulary_path

    def read(split, language):
        path = os.path.join(FLAGS.data, f"{split}.{language}")
        if not os.path.exists(path):
            raise app.UsageError(f"{path}: not found (real corpora live in ../shared/data)")
        return [line.strip() for line in pipelines.read_lines(path)]

    test_sources, test_targets = read(FLAGS.test, FLAGS.src), read(FLAGS.test, FLAGS.tgt)
    train_sources, train_targets = read(FLAGS.train, FLAGS.src), read(FLAGS.train, FLAGS.tgt)
    if FLAGS.ibm_pairs:
        train_sources, train_targets = train_sources[: FLAGS.ibm_pairs], train_targets[: FLAGS.ibm_pairs]
    sources = [ibm_words(line) for line in train_sources + test_sources]
    targets = [ibm_words(line) for line in train_targets + test_targets]

    # Both directions at once, in processes of their own (nltk's models are pure Python).
    print(f"Training IBM model {FLAGS.ibm_model} both ways on {len(train_sources)} + {len(test_sources)} pairs…")
    start = time.perf_counter()
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        keep = len(test_sources)
        forward = pool.submit(ibm_links, FLAGS.ibm_model, FLAGS.ibm_iterations, targets, sources, keep)
        backward = pool.submit(ibm_links, FLAGS.ibm_model, FLAGS.ibm_iterations, sources, targets, keep)
        (forward_links, forward_seconds), (backward_links, backward_seconds) = forward.result(), backward.result()
    ibm_wall_seconds = time.perf_counter() - start
    backward_links = [{(i, j) for j, i in links} for links in backward_links]  # as (source, target) pairs

    model, config = restore_model(FLAGS.model_dir, FLAGS.checkpoint)
    processor = pipelines.Tokenizer(vocabulary_path(FLAGS.model_dir)).python_processor()
    links, kept = attention_links(model, processor, test_sources, test_targets, config.num_layers)
    sure = [forward_links[k] & backward_links[k] for k in kept]
    union = [forward_links[k] | backward_links[k] for k in kept]
    lengths = [(len(test_sources[k].split()), len(test_targets[k].split())) for k in kept]
    floor = [diagonal(m, n) for m, n in lengths]

    for position in range(min(FLAGS.show, len(kept))):
        named = {"IBM ∩": sure[position], "diagonal": floor[position]}
        named.update({name: links[name][position] for name in links if not name.endswith("_shifted")})
        show(test_sources[kept[position]], test_targets[kept[position]], named)

    default = config.num_layers - 1  # the export's default layer: the last
    results = {"diagonal": scores(floor, sure, union)}
    results.update({name: scores(links[name], sure, union) for name in sorted(links)})
    print()
    for name, result in results.items():
        mark = " (export default)" if name == f"layer_{default}" else ""
        print(f"{name:>16}: " + "  ".join(f"{key} {value:.3f}" for key, value in result.items()) + mark)
    best = min(range(config.num_layers), key=lambda layer: results[f"layer_{layer}"]["aer"])
    print(
        json.dumps(
            {
                "benchmark": "alignment",
                "results": results,
                "best_layer": best,
                "export_default_layer": default,
                "layers": config.num_layers,
                "config": config.name,
                "checkpoint": FLAGS.checkpoint or default_checkpoint(FLAGS.model_dir),
                "test": FLAGS.test,
                "pairs_scored": len(kept),
                "pairs_skipped": len(test_sources) - len(kept),
                "target_words": sum(n for _, n in lengths),
                "sure_links": sum(len(s) for s in sure),
                "union_links": sum(len(p) for p in union),
                "ibm_model": int(FLAGS.ibm_model),
                "ibm_iterations": FLAGS.ibm_iterations,
                "ibm_pairs": len(train_sources),
                "ibm_seconds": {
                    "forward": round(forward_seconds, 1),
                    "backward": round(backward_seconds, 1),
                    "wall": round(ibm_wall_seconds, 1),
                },
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

"""Small synthetic corpora for tests, and where the real ones are (``../shared/data``)."""

import pathlib

import numpy as np

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega haus baum katze hund".split()
SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def write_corpus(directory, n=300, seed=0, extra=(), split="train"):
    """``split.en`` / ``split.de``: sources of 1–8 words, targets of 6–20 words (the two sides'
    lengths never overlap much), then the ``extra`` pairs. Returns ``(sources, targets)``."""
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(n):
        src.append(" ".join(rng.choice(WORDS, rng.integers(1, 9))))
        tgt.append(" ".join(rng.choice(WORDS, rng.integers(6, 21))).capitalize() + ".")
    for source, target in extra:
        src.append(source)
        tgt.append(target)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (directory / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return src, tgt


def tiny_config(**changes):
    """The ``tiny`` preset for a few steps on a synthetic corpus: 4 updates of 512-token batches, pairs of up
    to 64 subwords, a vocabulary of 120 pieces asked; ``changes`` as ``--set`` would."""
    from configs import get_config

    settings = dict(train_steps=4, tokens_per_batch=512, max_train_length=64, vocab_size=120)
    return get_config("tiny", **{**settings, **changes})


def tiny_options(data, **changes):
    """Run options for :func:`tiny_config` on a synthetic corpus: one epoch of 4 micro-batches, no dev set."""
    from configs import RunOptions

    values = dict(
        data=str(data),
        dev_split=None,
        steps_per_epoch=4,
        checkpoint_every=0,
        precision="float32",  # not auto: the same arithmetic on every test machine
        dev_bleu_sentences=0,
        verbose=0,
    )
    values.update(changes)
    return RunOptions(**values)


def random_tree(rng, depth: int = 0) -> str:
    """A small random Penn Treebank-style tree over :data:`WORDS` (with function tags, -NONE- and punctuation)."""
    if depth >= 2 or rng.random() < 0.3:
        return f"(NN {rng.choice(WORDS)})"
    label = rng.choice(["NP-SBJ", "VP", "PP-LOC=2", "ADVP"])
    children = [random_tree(rng, depth + 1) for _ in range(rng.integers(1, 4))]
    if rng.random() < 0.2:
        children.append("(-NONE- *T*-1)")
    return f"({label} {' '.join(children)})"


def write_treebank(directory, files: int = 4, trees: int = 25, seed: int = 0) -> list[str]:
    """``wsj_0001.mrg`` … : ``files`` files of ``trees`` random trees each, written as the WSJ files are
    (an unlabelled outer root, a final period). Returns the file paths."""
    rng = np.random.default_rng(seed)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for number in range(1, files + 1):
        body = "\n".join(f"( (S {random_tree(rng)} {random_tree(rng)} (. .)) )" for _ in range(trees))
        path = directory / f"wsj_{number:04d}.mrg"
        path.write_text(body + "\n", encoding="utf-8")
        paths.append(str(path))
    return paths

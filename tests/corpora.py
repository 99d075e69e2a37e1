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


def tiny_options(data, **changes):
    """Run options for a few steps of the ``tiny`` preset on a synthetic corpus (vocabulary of 120 pieces)."""
    from configs import RunOptions

    values = dict(
        data=str(data),
        dev_split=None,
        train_steps=4,
        steps_per_epoch=4,
        checkpoint_every=0,
        tokens_per_batch=512,
        max_train_length=64,
        vocab_size=120,
        precision="float32",  # not auto: the same arithmetic on every test machine
        dev_bleu_sentences=0,
        verbose=0,
    )
    values.update(changes)
    return RunOptions(**values)

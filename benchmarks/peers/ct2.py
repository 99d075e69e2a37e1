"""CTranslate2: the Hugging Face Marian model (:mod:`.huggingface`) converted with CTranslate2's
transformers converter, decoding ``float32`` and ``int8``; decoding only.

It is measured in each way of using ``--threads`` it offers (see :func:`decoder`):
all threads on one batch, workers on each batch's ``--batch_parts`` (or ``--workers``)
parts, and with ``--workers`` N, N workers on whole batches.
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.peers import DecodeRun, DecodingWorkload, Training
from benchmarks.peers.huggingface import marian, marian_ids
from benchmarks.peers.workload import FLAGS


def train_runners(size: str) -> dict[str, Training]:
    return {}  # CTranslate2 only decodes


def decode_runners(size: str, workload: DecodingWorkload) -> dict[str, DecodeRun]:
    ct2_dir, names = convert(marian(size), os.path.join(workload.work, f"ct2_{size}"))
    runners = {}
    for compute_type in ("float32", "int8"):
        runners[f"ct2_{compute_type}"] = decoder(ct2_dir, names, compute_type, workload.batches)
        if FLAGS.batch_parts > 1:
            runners[f"ct2_{compute_type}_parts{FLAGS.batch_parts}"] = decoder(
                ct2_dir, names, compute_type, workload.batches, batch_parts=FLAGS.batch_parts
            )
        if FLAGS.workers > 1:  # its two ways of using that many workers
            runners[f"ct2_{compute_type}_parts{FLAGS.workers}"] = decoder(
                ct2_dir, names, compute_type, workload.batches, batch_parts=FLAGS.workers
            )
            runners[f"ct2_{compute_type}_workers{FLAGS.workers}"] = decoder(
                ct2_dir, names, compute_type, workload.batches, workers=FLAGS.workers
            )
    return runners


def save_decoder(size: str, workload: DecodingWorkload) -> str:
    """The converted model (float32 weights)."""
    ct2_dir, _ = convert(marian(size), os.path.join(workload.work, f"ct2_{size}"))
    return ct2_dir


def load_decoder(path: str, batches: list[np.ndarray]):
    """float32, each batch in ``--batch_parts`` equal parts on as many workers."""
    run = decoder(path, vocabulary(), "float32", batches, FLAGS.batch_parts)
    return lambda i: run([i])


def vocabulary() -> list[str]:
    """The converted model's token names, id by id (Marian's order: ``<pad>`` last)."""
    return ["t0", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, FLAGS.vocab_size - 1)] + ["<pad>"]


def convert(model, work: str) -> tuple[str, list[str]]:
    """Saves the Marian model with an offline word-level tokenizer and converts it for CTranslate2.

    Returns the converted model's directory and its token names (:func:`vocabulary`).
    """
    import ctranslate2
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    names = vocabulary()
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel({n: i for i, n in enumerate(names)}, "<unk>"))
    word_level.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    hf_dir, ct2_dir = os.path.join(work, "marian"), os.path.join(work, "ct2")
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    ctranslate2.converters.TransformersConverter(hf_dir).convert(ct2_dir, force=True)
    return ct2_dir, names


def decoder(
    ct2_dir: str, names: list[str], compute_type: str, batches: list[np.ndarray], batch_parts: int = 1, workers: int = 1
) -> DecodeRun:
    """``run(group)``: CTranslate2's ``translate_batch`` on ``batches[i]`` for each ``i`` of ``group`` (as tokens,
    output length forced), one way of using ``--threads`` threads:

    - ``batch_parts == workers == 1``: one batch after another on all threads;
    - ``batch_parts > 1``: ``inter_threads=batch_parts`` workers of ``--threads / batch_parts``
      threads each translate a batch's ``batch_parts`` equal parts at once (as our
      export splits it), submitted asynchronously;
    - ``workers > 1``: ``inter_threads=workers`` workers of ``--threads / workers``
      threads, each translating whole batches of the group, all submitted asynchronously.
    """
    import ctranslate2

    assert batch_parts == 1 or workers == 1, (batch_parts, workers)
    parallel = max(batch_parts, workers)
    translator = ctranslate2.Translator(
        ct2_dir,
        device="cpu",
        compute_type=compute_type,
        intra_threads=FLAGS.threads // parallel,
        inter_threads=parallel,
    )
    last = FLAGS.vocab_size - 1
    token_batches = [[[names[i] for i in marian_ids(row) if i != last] for row in batch] for batch in batches]
    options = dict(
        beam_size=FLAGS.beam,
        max_batch_size=FLAGS.batch,
        min_decoding_length=FLAGS.output_tokens,
        max_decoding_length=FLAGS.output_tokens,
    )

    def parts(i):
        """``batches[i]`` in ``batch_parts`` equal parts."""
        part = -(-len(token_batches[i]) // batch_parts)
        return [token_batches[i][start : start + part] for start in range(0, len(token_batches[i]), part)]

    def check(results):
        lengths = {len(r.hypotheses[0]) for r in results}
        assert lengths == {FLAGS.output_tokens}, lengths

    def run(group):
        if parallel == 1:
            for i in group:
                check(translator.translate_batch(token_batches[i], **options))
            return
        # batch_parts: each batch's parts at once, batch after batch; workers: the group's whole batches at once.
        for pieces in [parts(i) for i in group] if batch_parts > 1 else [[token_batches[i] for i in group]]:
            pending = [translator.translate_batch(piece, asynchronous=True, **options) for piece in pieces]
            check([result.result() for piece in pending for result in piece])

    return run

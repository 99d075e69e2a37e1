"""Benchmark systems each in a process of its own, timed in turns of whole passes.

Decoders that share a process, or follow each other batch by batch, do not run as each
does alone. CTranslate2's OpenMP runtime (libgomp) keeps its idle threads spinning only
while the process has no more OpenMP threads than cores: two translators in one process
(float32 and int8, say) exceed a 2-core machine and both fall back to near-passive
waiting, far slower. And an OpenMP team spins for a while after each call, on the cores
the next system needs. So a system here is built in a spawned process that holds it
alone (:class:`Isolated`), and :func:`in_turn` lets the systems take turns by whole
passes over the sentences, with a pause between, the order rotating by round: what a
user who runs one of them gets. docs/benchmarks.md#ctranslate2 has the figures.
"""

from __future__ import annotations

import functools
import multiprocessing
import time

from benchmarks.common import median_ms, rotated


def saved_model_system(export_dir: str, threads: int, request=None):
    """An export as a system: ``serving_default``, or ``request`` (a ``DecodeRequest``) through
    ``translate_with_options``; TensorFlow on ``threads`` intra- and inter-op threads."""
    from benchmarks import start_tensorflow

    tf = start_tensorflow(threads)
    if request is None:
        translate = tf.saved_model.load(export_dir).signatures["serving_default"]
        return lambda batch: [t.decode() for t in translate(inputs=tf.constant(batch))["translations"].numpy()]
    from tf_transformer.inference.batch_translation import export_translate

    translate = export_translate(export_dir, request)
    return lambda batch: [nbest[0][0] for nbest in translate(batch)]


def ctranslate2_model_system(
    model_dir: str, compute_type: str, threads: int, beam_size: int, max_extra_length: int, **options
):
    """A converted model (``tft-export --format ctranslate2``) as a system: one translator on ``threads``
    intra-op threads, SentencePiece through the python package (:func:`benchmarks.common.ctranslate2_system`)."""
    import os

    import sentencepiece as spm

    from benchmarks.common import ctranslate2_system
    from tf_transformer.exporting.ctranslate2 import import_ctranslate2

    translator = import_ctranslate2().Translator(
        model_dir, device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1
    )
    sentencepiece = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "sp.model"))
    return ctranslate2_system(translator, sentencepiece, beam_size, max_extra_length, **options)


def _serve(connection, build) -> None:
    """The child: builds its system, then translates each list of batches it is sent, timing every batch,
    until it is sent ``None`` or its parent is gone."""
    system = build()
    connection.send("ready")
    while True:
        try:
            batches = connection.recv()
        except EOFError:  # the parent exited without closing this system
            return
        if batches is None:
            return
        outputs, seconds = [], []
        for batch in batches:
            start = time.perf_counter()
            outputs.extend(system(batch))
            seconds.append(time.perf_counter() - start)
        connection.send((outputs, seconds))


class Isolated:
    """A system (``build() → (list[str] → list[str])``, picklable: a ``functools.partial`` of a
    module-level function) built and run in a spawned process of its own."""

    def __init__(self, build: functools.partial):
        spawn = multiprocessing.get_context("spawn")
        parent, child = spawn.Pipe()
        self._connection = parent
        self._process = spawn.Process(target=_serve, args=(child, build), daemon=True)
        self._process.start()
        child.close()  # the child's end lives in the child only: its exit then reads as EOF here
        try:
            ready = parent.poll(1800) and parent.recv() == "ready"
        except EOFError:
            ready = False
        if not ready:
            self._process.kill()
            raise RuntimeError(f"the benchmark system {build} did not start (its error is above)")

    def run(self, batches: list[list[str]]) -> tuple[list[str], list[float]]:
        """The outputs of ``batches`` (one after another) and the seconds each batch took."""
        try:
            self._connection.send(batches)
            return self._connection.recv()
        except (EOFError, BrokenPipeError):
            raise RuntimeError("the benchmark system's process died (its error is above)") from None

    def close(self) -> None:
        self._connection.send(None)
        self._process.join(60)


def in_turn(systems: dict, sentences: list[str], batch: int, rounds: int, pause: float = 1.0) -> dict:
    """Each :class:`Isolated` system's ``(sentences per second, outputs of the first round, p50 batch ms)``
    over ``sentences`` in batches of ``batch``: ``rounds`` rounds in which every system translates all of
    them in turn (the order rotating by round, ``pause`` seconds between turns); one warm-up batch each."""
    batches = [sentences[start : start + batch] for start in range(0, len(sentences), batch)]
    for system in systems.values():
        system.run(batches[:1])
    seconds = {name: [] for name in systems}
    outputs = {}
    for round_index in range(rounds):
        for name in rotated(list(systems), round_index):
            time.sleep(pause)
            translated, taken = systems[name].run(batches)
            seconds[name].extend(taken)
            outputs.setdefault(name, translated)
    return {
        name: (round(len(sentences) * rounds / sum(seconds[name]), 2), outputs[name], median_ms(seconds[name]))
        for name in systems
    }

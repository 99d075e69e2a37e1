"""benchmarks.isolated: each system in a process of its own, the systems taking turns by whole passes."""

import functools
import os

import pytest

from benchmarks.isolated import Isolated, in_turn


def tagging_system(tag: str):
    """A system that marks each sentence with ``tag`` and the process that translated it."""
    return lambda batch: [f"{tag}:{os.getpid()}:{sentence}" for sentence in batch]


def test_systems_run_in_processes_of_their_own_and_keep_the_sentence_order():
    systems = {name: Isolated(functools.partial(tagging_system, name)) for name in ("a", "b")}
    try:
        sentences = [f"s{i}" for i in range(7)]
        results = in_turn(systems, sentences, batch=3, rounds=2, pause=0.0)
    finally:
        for system in systems.values():
            system.close()
    processes = {}
    for name, (per_second, outputs, p50_ms) in results.items():
        tags, pids, texts = zip(*(output.split(":") for output in outputs), strict=True)
        assert set(tags) == {name} and list(texts) == sentences
        assert per_second > 0 and p50_ms >= 0
        processes[name] = set(pids)
    assert all(len(pids) == 1 for pids in processes.values())
    assert processes["a"] != processes["b"] and str(os.getpid()) not in processes["a"] | processes["b"]


def failing_system():
    raise ValueError("no such model")


def test_a_system_that_cannot_be_built_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="did not start"):
        Isolated(functools.partial(failing_system))

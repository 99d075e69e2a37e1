"""Serving benchmark (not a test): tft-serve's sentences/s and latency under concurrent clients, with batching or not.

    python -m benchmarks.serving --model saved_models/multi30k_en_de \\
        --sentences ../shared/data/multi30k/test_2016_flickr.en

Starts ``tft-serve`` on 127.0.0.1 four times over the same export: with request
batching as by default (two batch threads), with one batch thread, with batches
of one sentence on one thread (requests decoded one at a time, as the server did
before batching), and with batching off (concurrent requests each run their own
decode at once). In each, ``--clients`` clients send
``--requests`` single-sentence requests each, after a warm-up round. Translations
from the batching server are compared with the one-at-a-time server's (lone
calls): merging may change one only at float near-ties. Then a fault round
against the batching server: 16 clients × 50 requests mixing good sentences,
malformed JSON, wrong types, oversize bodies, overlong sentences and
mid-request disconnects, reporting the answers by kind and the server's resident
memory after a warm-up round and after the run. The last line printed is one
JSON object. Client helpers: ``tests/serving``.

    python -m benchmarks.serving --vs_checkout ../before --rounds 8

compares this checkout's server with another checkout's (say, a worktree of an
earlier commit) instead: both serve the same export side by side, and rounds of
``--clients`` clients sending single sentences alternate between them, so that
the host's drift falls on both alike; each server's median over its rounds and
the ratios are printed.

    python -m benchmarks.serving --grpc_vs_rest --rounds 6

measures one server (default flags) through both of its APIs instead: rounds of
``--clients`` clients alternate between gRPC (``tensorflow-serving-api``'s stub,
one channel per client) and REST (a new connection per request, as above), and
each API's median sentences/s and p50/p99 latency are printed, with how many
translations differ between the two.

    python -m benchmarks.serving --cold_start

times the first requests a freshly started server answers: for each API and
for the shortest and the longest of the sentences, a new server, then the same
one-sentence request three times from the moment it is ready. The first
against the third says what a user pays for a cold server; the server's load
and warmup seconds (its metrics) say what warming costs at load instead.
"""

from __future__ import annotations

import collections
import json
import os
import time

import numpy as np
from absl import app, flags

from benchmarks.common import machine
from tests.serving.client import Server
from tests.serving.load import run_grpc_load, run_load

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "saved_models/multi30k_en_de", "Export base directory (or one version's).")
flags.DEFINE_string("sentences", "../shared/data/multi30k/test_2016_flickr.en", "Source sentences, one per line.")
flags.DEFINE_integer("clients", 16, "Concurrent clients.")
flags.DEFINE_integer("requests", 25, "Requests per client, one sentence each.")
flags.DEFINE_integer("warmup", 3, "Requests per client before measuring.")
flags.DEFINE_string("vs_checkout", None, "Another checkout: compare its tft-serve with this one's (alone).")
flags.DEFINE_integer("rounds", 8, "With --vs_checkout or --grpc_vs_rest: measured rounds, alternating.")
flags.DEFINE_bool("grpc_vs_rest", False, "Compare one server's gRPC and REST APIs (alone).")
flags.DEFINE_bool("cold_start", False, "Time the first requests of freshly started servers (alone).")

LAYOUTS = {
    "batching": [],  # two batch threads, each op of a batch on one core of two
    "batching_one_thread": ["--num_batch_threads", "1"],
    "one_at_a_time": ["--max_batch_size", "1", "--num_batch_threads", "1"],
    "no_batching": ["--noenable_batching"],
}


def measure(flags_: list[str], sentences: list[str]) -> dict:
    server = Server(FLAGS.model, *flags_)
    try:
        warm_up(server, sentences)
        result = one_round(server, sentences)
    finally:
        server.stop()
    return result


def warm_up(server: Server, sentences: list[str]) -> None:
    load = dict(sentences=sentences, overlong="", max_request_bytes=0, clients=FLAGS.clients, kinds=("good",))
    run_load(server.port, server.name, requests=FLAGS.warmup, seed=10_000, **load)


def one_round(server: Server, sentences: list[str], seed: int = 0, keep_indices: bool = False) -> dict:
    """``--clients`` clients sending ``--requests`` single sentences each: sentences/s, p50/p99 latency, and the
    translations in order (``keep_indices``: by sentence index)."""
    load = dict(sentences=sentences, overlong="", max_request_bytes=0, clients=FLAGS.clients, kinds=("good",))
    start = time.perf_counter()
    results = run_load(server.port, server.name, requests=FLAGS.requests, seed=seed, **load)
    seconds = time.perf_counter() - start
    failed = [status for _, _, status, _, _ in results if status != 200]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed: {failed[:5]}")
    translations = [answer["predictions"][0]["translations"] for *_, answer, _ in results]
    if keep_indices:
        translations = {index: text for (_, index, *_), text in zip(results, translations, strict=True)}
    return {**_pace([elapsed for *_, elapsed in results], seconds), "translations": translations}


def compare(sentences: list[str]) -> dict:
    """This checkout's server against ``--vs_checkout``'s, default flags, rounds alternating (the same seeds)."""
    servers = {  # both started the same way: `python -m` with their checkout first on the path
        "this": Server(FLAGS.model, checkout=os.getcwd()),
        "other": Server(FLAGS.model, checkout=FLAGS.vs_checkout),
    }
    rounds = {name: [] for name in servers}
    try:
        for server in servers.values():
            warm_up(server, sentences)
        for r in range(FLAGS.rounds):
            for name in ("this", "other") if r % 2 == 0 else ("other", "this"):
                result = one_round(servers[name], sentences, seed=100 * r)
                result.pop("translations")
                rounds[name].append(result)
    finally:
        for server in servers.values():
            server.stop()
    median = {
        name: {key: float(np.median([row[key] for row in rows])) for key in rows[0]} for name, rows in rounds.items()
    }
    return {
        "benchmark": "serving_vs_checkout",
        "machine": machine(),
        "model": FLAGS.model,
        "other_checkout": os.path.abspath(FLAGS.vs_checkout),
        "clients": FLAGS.clients,
        "requests_per_round": FLAGS.clients * FLAGS.requests,
        "rounds": FLAGS.rounds,
        "median": median,
        "this_vs_other": {key: round(median["this"][key] / median["other"][key], 3) for key in median["this"]},
        "per_round": rounds,
    }


def grpc_round(server: Server, sentences: list[str], seed: int = 0) -> dict:
    """:func:`one_round` through gRPC."""
    start = time.perf_counter()
    results = run_grpc_load(server.grpc_port, server.name, sentences, FLAGS.clients, FLAGS.requests, seed)
    seconds = time.perf_counter() - start
    translations = {index: text for index, text, _ in results}
    return {**_pace([elapsed for *_, elapsed in results], seconds), "translations": translations}


def _pace(latencies: list[float], seconds: float) -> dict:
    """Sentences per second of a round of one-sentence requests that took ``seconds``, and its p50/p99 latency."""
    return {
        "sentences_per_second": round(len(latencies) / seconds, 2),
        "p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 1),
        "p99_ms": round(float(np.percentile(latencies, 99)) * 1000, 1),
    }


def grpc_vs_rest(sentences: list[str]) -> dict:
    """One server's gRPC and REST APIs, rounds alternating (the same seeds): medians, and differing translations."""
    server = Server(FLAGS.model)
    rounds, texts = {"grpc": [], "rest": []}, {"grpc": {}, "rest": {}}
    try:
        warm_up(server, sentences)
        run_grpc_load(server.grpc_port, server.name, sentences, FLAGS.clients, FLAGS.warmup, seed=10_000)
        for r in range(FLAGS.rounds):
            for api in ("grpc", "rest") if r % 2 == 0 else ("rest", "grpc"):
                if api == "grpc":
                    result = grpc_round(server, sentences, seed=100 * r)
                    texts["grpc"].update(result.pop("translations"))
                else:
                    result = one_round(server, sentences, seed=100 * r, keep_indices=True)
                    texts["rest"].update(result.pop("translations"))
                rounds[api].append(result)
    finally:
        server.stop()
    median = {
        api: {key: float(np.median([row[key] for row in rows])) for key in rows[0]} for api, rows in rounds.items()
    }
    shared = set(texts["grpc"]) & set(texts["rest"])
    return {
        "benchmark": "serving_grpc_vs_rest",
        "machine": machine(),
        "model": FLAGS.model,
        "clients": FLAGS.clients,
        "requests_per_round": FLAGS.clients * FLAGS.requests,
        "rounds": FLAGS.rounds,
        "median": median,
        "grpc_vs_rest": {key: round(median["grpc"][key] / median["rest"][key], 3) for key in median["grpc"]},
        "sentences_compared": len(shared),
        "translations_differing": sum(texts["grpc"][i] != texts["rest"][i] for i in shared),
        "per_round": rounds,
    }


def cold_start(sentences: list[str]) -> dict:
    """First, second and third one-sentence request of a new server, per API and for a short and a long sentence."""
    by_length = sorted((s for s in sentences if s.strip()), key=lambda s: len(s.split()))
    chosen = {"short": by_length[0], "long": by_length[-1]}
    rows = {}
    for api in ("rest", "grpc"):
        for length, sentence in chosen.items():
            server = Server(FLAGS.model)
            try:
                seconds = [_one_request(server, api, sentence) for _ in range(3)]
                _, text = server.get("/monitoring/prometheus/metrics", parse=False)
            finally:
                server.stop()
            rows[f"{api}_{length}"] = {
                "words": len(sentence.split()),
                "first_ms": round(seconds[0] * 1000, 1),
                "second_ms": round(seconds[1] * 1000, 1),
                "third_ms": round(seconds[2] * 1000, 1),
                "first_vs_third": round(seconds[0] / seconds[2], 2),
                **_load_metrics(text),
            }
    return {"benchmark": "serving_cold_start", "machine": machine(), "model": FLAGS.model, "rows": rows}


def _one_request(server: Server, api: str, sentence: str) -> float:
    start = time.perf_counter()
    if api == "rest":
        status, _ = server.post({"instances": [sentence]})
        if status != 200:
            raise SystemExit(f"REST answered {status}")
    else:
        run_grpc_load(server.grpc_port, server.name, [sentence], clients=1, requests=1)
    return time.perf_counter() - start


def _load_metrics(text: str) -> dict:
    """The version's load seconds and warmup seconds (when the server reports them) from its metrics' text."""
    found = {}
    for line in text.splitlines():
        for name, key in (
            ("tft_serving_model_load_seconds{", "load_s"),
            ("tft_serving_model_warmup_seconds{", "warmup_s"),
        ):
            if line.startswith(name):
                found[key] = round(float(line.rsplit(" ", 1)[1]), 2)
    return found


def faults(sentences: list[str]) -> dict:
    """Answers by request kind under a mix of good and bad requests, and the server's memory around it."""
    limit = 1 << 20
    server = Server(FLAGS.model, "--max_request_bytes", str(limit), "--rest_api_timeout_in_ms", "3000")
    try:
        overlong = " ".join(sentences) * 4  # thousands of tokens: over any export's limit
        load = dict(sentences=sentences, overlong=overlong, max_request_bytes=limit, clients=16)
        run_load(server.port, server.name, requests=10, seed=20_000, **load)
        warm = server.resident_bytes()
        results = run_load(server.port, server.name, requests=50, **load)
        after = server.resident_bytes()
        alive = server.get(f"/v1/models/{server.name}")[0] == 200
    finally:
        code = server.stop()
    answers = collections.Counter(f"{kind}:{status}" for kind, _, status, _, _ in results)
    return {
        "requests": len(results),
        "answers": dict(sorted(answers.items())),
        "alive": alive,
        "exit_code": code,
        "rss_mb_after_warm_up": round(warm / 2**20, 1),
        "rss_mb_after": round(after / 2**20, 1),
    }


def main(argv):
    del argv
    with open(FLAGS.sentences, encoding="utf-8") as handle:
        sentences = [line.rstrip("\n") for line in handle][:500]
    if FLAGS.vs_checkout:
        print(json.dumps(compare(sentences)))
        return
    if FLAGS.grpc_vs_rest:
        print(json.dumps(grpc_vs_rest(sentences)))
        return
    if FLAGS.cold_start:
        print(json.dumps(cold_start(sentences)))
        return
    results = {name: measure(flags_, sentences) for name, flags_ in LAYOUTS.items()}
    lone = results["one_at_a_time"].pop("translations")
    merged = results["batching"].pop("translations")
    results["no_batching"].pop("translations")
    results["batching_one_thread"].pop("translations")
    differ = sum(a != b for a, b in zip(merged, lone, strict=True))
    speedup = results["batching"]["sentences_per_second"] / results["one_at_a_time"]["sentences_per_second"]
    summary = {
        "benchmark": "serving",
        "machine": machine(),
        "model": FLAGS.model,
        "clients": FLAGS.clients,
        "requests": FLAGS.clients * FLAGS.requests,
        **results,
        "batching_vs_one_at_a_time": round(speedup, 2),
        "batched_translations_differing_from_lone_calls": differ,
        "faults": faults(sentences),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    app.run(main)

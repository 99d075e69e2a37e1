"""tft-serve under a bounded load of good and bad requests from 16 clients (loopback only).

Every good request gets what a direct call of the signature returns (merging
into batches may change a translation only at float near-ties: at most 1 %),
every bad one a 4xx with a JSON error, the server lives on, and its memory after
the run is within 10 % of what it was after a warm-up round.
"""

import collections

import pytest
import tensorflow as tf

from tests.serving.client import Server
from tests.serving.load import run_load

pytestmark = pytest.mark.slow

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega haus baum katze hund".split()
SENTENCES = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + i % 8)) for i in range(40)]
LIMIT = 65536


def direct(export) -> list[str]:
    """Each sentence translated alone by the signature, in this process."""
    import tensorflow_text  # noqa: F401

    signature = tf.saved_model.load(str(export)).signatures["serving_default"]
    return [signature(inputs=tf.constant([s]))["translations"].numpy()[0].decode() for s in SENTENCES]


def test_sixteen_clients_of_good_and_bad_requests(tiny_export):
    expected = direct(tiny_export)
    overlong = "zeta " * 600  # over the fixture export's 512
    server = Server(tiny_export.parent, "--max_request_bytes", str(LIMIT), "--rest_api_timeout_in_ms", "3000")
    try:
        warm = run_load(server.port, server.name, SENTENCES, overlong, LIMIT, clients=16, requests=10, seed=1000)
        assert all(status == 200 for kind, _, status, _, _ in warm if kind == "good")
        memory_after_warm_up = server.resident_bytes()

        results = run_load(server.port, server.name, SENTENCES, overlong, LIMIT, clients=16, requests=50)
        assert len(results) == 800
        kinds = collections.Counter(kind for kind, *_ in results)
        assert set(kinds) == {"good", "malformed", "wrong_type", "oversize", "overlong", "disconnect"}

        differ = 0
        for kind, index, status, answer, _ in results:
            if kind == "disconnect":
                continue
            if kind == "good":
                assert status == 200, answer
                differ += answer["predictions"][0]["translations"] != expected[index]
            else:
                assert 400 <= status < 500 and isinstance(answer["error"], str), (kind, status, answer)
        assert differ <= 0.01 * kinds["good"], f"{differ} of {kinds['good']} translations differ from a lone call"

        status, body = server.get(f"/v1/models/{server.name}")
        assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"  # alive
        memory_after = server.resident_bytes()
        assert memory_after <= 1.10 * memory_after_warm_up, (memory_after, memory_after_warm_up)
    finally:
        assert server.stop() == 0

"""Requests merged into one batch each get what a lone call of the signature returns: shapes, values, strings.

A batch pads the attention ``[batch, out_len, src_len]`` and the ids ``[batch,
out_len]`` to its longest sentence; a request's answer must not depend on who
shared its batch.
"""

import concurrent.futures
import threading

import numpy as np
import pytest

from configs.serving import ServingOptions
from tests.serving.client import request
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.exporting.export_info import ExportInfo
from tf_transformer.serving import make_server
from tf_transformer.serving.servable import Servable

# Six sentences each, of different source lengths: a batch of six runs as soon as all have arrived.
ALIGN = [["zeta"], ["alpha beta gamma delta epsilon zeta theta"], ["", "omega sigma"], ["haus baum katze", "kappa"]]
IDS = [[[9, 3]], [[10, 11, 12, 13, 14, 15, 3]], [[9, 10, 3], [12, 3]], [[16, 3], [17, 18, 19, 3]]]
BATCH = 6


@pytest.fixture(scope="module")
def served(tiny_export):
    """tft-serve's server in this process over ``tiny_export``; the sizes of the batches its model ran."""
    options = ServingOptions(
        port=0, rest_api_port=0, max_batch_size=BATCH, batch_timeout_micros=30_000_000, num_batch_threads=1
    )
    server = make_server(str(tiny_export), options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert server.versions.wait_loaded(300)
        servable = server.versions.servable()
        lone_call, batches = servable.run, []

        def recording(signature, rows):
            batches.append(len(rows))
            return lone_call(signature, rows)

        with pytest.MonkeyPatch.context() as patch:  # the fixture outlives a test's monkeypatch
            patch.setattr(servable, "run", recording)
            yield server.server_address[1], lone_call, batches
    finally:
        server.stop()


def merged_answers(port, signature, requests):
    """The predictions of ``requests`` sent at once."""

    def send(rows):
        return request(port, "POST", "/v1/models/tiny_en_de:predict", {"signature_name": signature, "instances": rows})

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        replies = list(pool.map(send, requests))
    for status, reply in replies:
        assert status == 200, reply
    return [reply["predictions"] for _, reply in replies]


@pytest.mark.parametrize("signature, requests", [("translate_with_alignment", ALIGN), ("translate_ids", IDS)])
def test_merged_requests_get_a_lone_calls_answer(served, signature, requests):
    port, lone_call, batches = served
    batches.clear()
    answers = merged_answers(port, signature, requests)
    assert batches == [BATCH]  # all in one batch
    for rows, predictions in zip(requests, answers, strict=True):
        direct = lone_call(signature, rows)
        assert len(predictions) == len(rows)
        for index, prediction in enumerate(predictions):
            assert set(prediction) == set(direct)
            for key, value in direct.items():
                got, want = np.asarray(prediction[key]), value[index]
                if value.dtype == object:
                    assert got == want.decode(), (rows, key)  # translations, alignments
                else:
                    assert got.shape == want.shape, (rows, key, got.shape, want.shape)
                    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=f"{rows} {key}")


def test_a_lone_calls_width_is_its_longest_decode_not_its_hypothesis():
    """``ids`` of a lone call run to source + ``max_extra_length`` (zeros after an early EOS), cut sources cut."""
    servable = Servable.__new__(Servable)  # fit needs only the settings an export records, no graph
    servable.input_kinds = {"translate_ids": "ids"}
    servable.info = ExportInfo(options=DecodeOptions(max_extra_length=2, min_length=0))
    # A batch of [10, 3] and [10, 11, 12, 13, 3]: 5 source tokens + 2 = 7 wide.
    batch = {"ids": np.array([[5, 3, 0, 0, 0, 0, 0], [6, 7, 8, 9, 3, 0, 0]]), "scores": np.array([-1.0, -2.0])}
    first = servable.fit("translate_ids", [[10, 3]], {key: value[:1] for key, value in batch.items()})
    assert first["ids"].tolist() == [[5, 3, 0, 0]] and first["scores"].tolist() == [-1.0]
    options = DecodeOptions(max_extra_length=2, max_source_length=3, truncate_source=True)
    servable.info = ExportInfo(options=options)  # [10, 11, 3]: 3 + 2
    second = servable.fit("translate_ids", [[10, 11, 12, 13, 3]], {key: value[1:] for key, value in batch.items()})
    assert second["ids"].tolist() == [[6, 7, 8, 9, 3]]

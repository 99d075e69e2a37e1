"""Servable.check: a request over an export's limits is refused before any graph runs, however it is padded."""

import pytest

from tests.serving.client import in_process, request
from tf_transformer.constants import EOS_ID, PAD_ID
from tf_transformer.serving.rest_api import ClientError, PredictRequest


@pytest.fixture(scope="module")
def server(tiny_export):
    """tft-serve's server in this process over ``tiny_export`` (its maximum source length is 512)."""
    with in_process(tiny_export) as started:
        yield started


def ids(*rows):
    return PredictRequest("translate_ids", [list(row) for row in rows], row_format=True)


def test_padding_ids_count_toward_the_source_length(server):
    """A row's length is its ids, padding included: the graph runs on the batch padded to its widest row."""
    servable = server.versions.servable()
    assert servable.limits.limit == 512
    servable.check(ids([9] * 511 + [EOS_ID], [9, EOS_ID]))
    servable.check(ids([9, EOS_ID] + [PAD_ID] * 510))  # padded to the limit exactly
    for row in ([5] + [PAD_ID] * 400_000, [9] * 100 + [EOS_ID] + [PAD_ID] * 412, [PAD_ID] * 513):
        with pytest.raises(ClientError, match="maximum source length of 512") as raised:
            servable.check(ids([9, EOS_ID], row))
        assert raised.value.status == 400 and str(raised.value).startswith("input 1:")  # checked, not decoded


def test_a_row_of_one_token_and_400000_zeros_is_400_at_once(server):
    """The request measured on make demo's export (answered 500 after 11.9 s): now 400, before any decoding."""
    body = b'{"signature_name": "translate_ids", "instances": [[5' + b", 0" * 400_000 + b"]]}"
    status, reply = request(
        server.server_address[1], "POST", f"/v1/models/{server.versions.name}:predict", raw=body, timeout=60
    )
    assert status == 400 and reply["error"].startswith("input 0: 400001 ids"), reply  # the check, before batching

"""Predict requests: TF Serving's two formats accepted, every client mistake a ClientError (never a crash)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.serving.bodies import raw_bodies
from tests.serving.reference_answers import response
from tf_transformer.serving.rest_api import ClientError, encode_response, parse_json, parse_predict

KINDS = {"serving_default": "strings", "translate_ids": "ids"}


def parse(body, max_batch_size=4):
    return parse_predict(body, KINDS, max_batch_size)


def test_both_formats_and_named_inputs():
    assert parse({"instances": ["a", "b"]}).rows == ["a", "b"]
    assert parse({"instances": [{"inputs": "a"}]}).rows == ["a"]
    columnar = parse({"inputs": {"inputs": ["a"]}})
    assert columnar.rows == ["a"] and not columnar.row_format
    ids = parse({"signature_name": "translate_ids", "instances": [[9, 3], [4, 5, 3]]})
    assert ids.signature == "translate_ids" and ids.rows == [[9, 3], [4, 5, 3]]


@pytest.mark.parametrize(
    "body, message",
    [
        ([], "JSON object"),
        ({"instances": ["a"], "inputs": ["a"]}, "exactly one"),
        ({}, "exactly one"),
        ({"instances": []}, "non-empty"),
        ({"instances": "a"}, "non-empty list"),
        ({"instances": ["a"] * 5}, "exceeds the maximum of 4"),
        ({"instances": ["a"], "signature_name": "nope"}, "Unknown signature_name"),
        ({"instances": ["a"], "signature_name": ["x"]}, "Unknown signature_name"),
        ({"instances": [1]}, "input 0 is a number"),
        ({"instances": ["a", None]}, "input 1 is null"),
        ({"instances": ["a", "\ud800"]}, "input 1 is not valid Unicode"),
        ({"instances": [["a"]]}, "input 0 is a list"),
        ({"instances": [{"inputs": "a", "x": 1}]}, "exactly the key"),
        ({"inputs": {"x": ["a"]}}, "only input"),
        ({"signature_name": "translate_ids", "instances": [[9, "3"]]}, "integer token ids"),
        ({"signature_name": "translate_ids", "instances": [[9, True]]}, "integer token ids"),
        ({"signature_name": "translate_ids", "instances": [[9, 3.0]]}, "integer token ids"),
        ({"signature_name": "translate_ids", "instances": [[]]}, "non-empty lists"),
        ({"signature_name": "translate_ids", "instances": [[[9]]]}, "integer token ids"),
        ({"signature_name": "translate_ids", "instances": [[2**40]]}, "outside int32"),
    ],
)
def test_client_mistakes_are_client_errors(body, message):
    with pytest.raises(ClientError, match=message) as raised:
        parse(body)
    assert raised.value.status == 400


def test_undecodable_and_deeply_nested_bodies():
    for raw, message in [(b"\xff\xfe", "not UTF-8"), (b"{not json", "Malformed JSON"), (b"[" * 100_000, "Malformed")]:
        with pytest.raises(ClientError, match=message):
            parse_json(raw)


def test_an_integer_literal_longer_than_python_converts_is_a_client_error():
    """Python 3.11 refuses to convert integer literals of over 4,300 digits with a plain ValueError."""
    raw = b'{"signature_name": "translate_ids", "instances": [[' + b"9" * 5000 + b", 3]]}"
    with pytest.raises(ClientError, match="Malformed JSON") as raised:
        parse_json(raw)
    assert raised.value.status == 400


@settings(max_examples=500, deadline=None)
@given(raw_bodies())
def test_any_raw_body_is_accepted_or_refused_never_crashes(raw):
    """The bytes of a body, not only values json.dumps writes: parse_json and parse_predict raise nothing but
    ClientError (a 4xx), whatever the bytes."""
    try:
        request = parse_predict(parse_json(raw), KINDS, 8)
    except ClientError as error:
        assert 400 <= error.status < 500
        return
    assert request.rows and len(request.rows) <= 8


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=20,
    )
)
def test_any_json_is_accepted_or_refused_never_crashes(value):
    for body in (value, {"instances": value}, {"signature_name": "translate_ids", "inputs": value}):
        try:
            request = parse_predict(parse_json(json.dumps(body).encode()), KINDS, 8)
        except ClientError:
            continue
        assert request.rows and len(request.rows) <= 8


def test_answers_in_each_format():
    outputs = {"translations": np.array([b"x", "\u00fc".encode()], object), "scores": np.array([-1.0, -2.0])}
    rows = parse({"instances": ["a", "b"]})
    expected = {"predictions": [{"translations": "x", "scores": -1.0}, {"translations": "\u00fc", "scores": -2.0}]}
    assert json.loads(encode_response(rows, outputs, 10_000)) == expected == response(rows, outputs)
    columns = parse({"inputs": ["a", "b"]})
    expected = {"outputs": {"translations": ["x", "\u00fc"], "scores": [-1.0, -2.0]}}
    assert json.loads(encode_response(columns, outputs, 10_000)) == expected == response(columns, outputs)


def test_encoded_answers_are_json_dumps_of_the_answer_and_bounded():
    outputs = {
        "translations": np.array([b"x", "\u00fc".encode()], object),
        "scores": np.array([-1.0, -2.5], np.float32),
        "attention": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,  # [batch, target, source]
        "nbest": np.array([[b"a", b"b"], [b"c", b"d"]], object),
    }
    for body in ({"instances": ["a", "b"]}, {"inputs": ["a", "b"]}):
        request = parse(body)
        encoded = encode_response(request, outputs, 10_000)
        assert encoded == json.dumps(response(request, outputs)).encode()
        assert json.loads(encoded) == response(request, outputs)
        assert encode_response(request, outputs, len(encoded)) == encoded  # the limit holds to the byte
        with pytest.raises(ClientError):
            encode_response(request, outputs, len(encoded) - 1)
        with pytest.raises(ClientError, match=r"limit of 200 bytes \(--max_response_bytes\)") as raised:
            encode_response(request, outputs, 200)
        assert raised.value.status == 413

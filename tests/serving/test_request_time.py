"""tft-serve's request-time signatures: options, scoring and sampling over TF Serving's REST API."""

import numpy as np
import pytest
import tensorflow as tf

from tests.serving.client import in_process, request
from tf_transformer.serving.rest_api import ClientError, parse_predict
from tf_transformer.serving.servable import Servable

SENTENCES = ["alpha beta gamma", "zeta omega", ""]
OPTIONS = {"beam_size": 2, "alpha": 1.0, "nbest": 2, "min_length": 2, "max_extra_length": 8}


@pytest.fixture(scope="module")
def server(tiny_export):
    with in_process(tiny_export) as started:
        yield started


def predict(server, body):
    return request(server.server_address[1], "POST", f"/v1/models/{server.versions.name}:predict", body)


def test_options_in_the_columnar_format_answer_as_the_signature(server, tiny_export):
    import tensorflow_text  # noqa: F401

    prefixes = ["", "Ha", ""]
    status, reply = predict(
        server,
        {
            "signature_name": "translate_with_options",
            "inputs": {"inputs": SENTENCES, "target_prefix": prefixes, **OPTIONS},
        },
    )
    assert status == 200, reply
    direct = tf.saved_model.load(str(tiny_export)).signatures["translate_with_options"](
        inputs=tf.constant(SENTENCES),
        target_prefix=tf.constant(prefixes),
        **{key: tf.constant(value) for key, value in OPTIONS.items()},
    )
    outputs = reply["outputs"]
    assert outputs["translations"] == [[t.decode() for t in row] for row in direct["translations"].numpy()]
    np.testing.assert_allclose(outputs["scores"], direct["scores"].numpy(), atol=1e-5)
    assert all(text.startswith("Ha") for text in outputs["translations"][1])


def test_scalars_need_the_columnar_format(server):
    status, reply = predict(
        server, {"signature_name": "translate_with_options", "instances": [{"inputs": "zeta", "target_prefix": ""}]}
    )
    assert status == 400 and "columnar" in reply["error"], reply


@pytest.mark.parametrize(
    "change, message",
    [
        ({"beam_size": "2"}, "'beam_size' must be an integer"),
        ({"alpha": None}, "'alpha' must be a number"),
        ({"beam_size": 3}, "beam_size must be one of 1, 2, 4, 8"),
        ({"nbest": 3}, "nbest must be at most beam_size"),
        ({"max_extra_length": 11}, "max_extra_length must be at most 10"),
        ({"target_prefix": ["a"]}, "'target_prefix' has 1 entries but 'inputs' has 3"),
        ({"beam_size": 2**31}, "'beam_size' is outside int32"),
        ({"alpha": float("inf")}, "alpha must be at most 10"),
        ({"alpha": 1e300}, "alpha must be at most 10"),
    ],
)
def test_wrong_options_are_400_naming_them(server, change, message):
    inputs = {"inputs": SENTENCES, "target_prefix": [""] * 3, **OPTIONS, **change}
    status, reply = predict(server, {"signature_name": "translate_with_options", "inputs": inputs})
    assert status == 400 and message in reply["error"], reply


def test_a_missing_input_is_named(server):
    inputs = {"inputs": SENTENCES, **OPTIONS}
    status, reply = predict(server, {"signature_name": "translate_with_options", "inputs": inputs})
    assert status == 400 and "missing ['target_prefix']" in reply["error"], reply


def test_scoring_takes_rows_and_gives_back_the_search_scores(server):
    status, reply = predict(server, {"instances": SENTENCES})
    assert status == 200
    translations = [row["translations"] for row in reply["predictions"]]
    instances = [{"inputs": s, "targets": t} for s, t in zip(SENTENCES, translations, strict=True)]
    status, scored = predict(server, {"signature_name": "score", "instances": instances})
    assert status == 200, scored
    rows = scored["predictions"]
    assert set(rows[0]) == {"log_probs", "scores", "lengths", "token_log_probs"}
    for row, answer in zip(rows[:2], reply["predictions"][:2], strict=True):  # "" is given score 0 by convention
        assert row["scores"] == pytest.approx(answer["scores"], abs=2e-4)
        assert sum(row["token_log_probs"]) == pytest.approx(row["log_probs"], abs=1e-3)


def test_a_temperature_out_of_range_is_400_naming_it(server):
    """JSON's Infinity and a huge number: a temperature that would make the banned tokens drawable is refused."""
    for temperature in (float("inf"), 1e8):
        inputs = {"inputs": SENTENCES, "seed": 5, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        status, reply = predict(server, {"signature_name": "sample", "inputs": {**inputs, "max_extra_length": 6}})
        assert status == 400 and "temperature must be at most 100" in reply["error"], reply


def test_sampling_is_reproducible_across_requests(server):
    body = {
        "signature_name": "sample",
        "inputs": {
            "inputs": SENTENCES,
            "seed": 5,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 0.95,
            "max_extra_length": 6,
        },
    }
    first, second = predict(server, body), predict(server, body)
    assert first[0] == 200 and first == second
    body["inputs"]["seed"] = 6
    assert predict(server, body)[1] != first[1]


def test_parse_predict_reads_several_inputs():
    kinds = {"with_options": {"inputs": "strings", "target_prefix": "strings", "beam_size": "int32", "alpha": "float"}}
    request_ = parse_predict(
        {
            "signature_name": "with_options",
            "inputs": {"inputs": ["a"], "target_prefix": [""], "beam_size": 4, "alpha": 1},
        },
        kinds,
        8,
    )
    assert request_.rows == ["a"] and request_.columns == {"target_prefix": [""]}
    assert request_.scalars == {"beam_size": 4, "alpha": 1}
    with pytest.raises(ClientError, match="exceeds the maximum of 1"):
        parse_predict(
            {
                "signature_name": "with_options",
                "inputs": {"inputs": ["a", "b"], "target_prefix": ["", ""], "beam_size": 4, "alpha": 1},
            },
            kinds,
            1,
        )


@pytest.mark.slow
def test_a_parsers_n_best_are_repaired_into_trees(tiny_parser):
    _, export, _ = tiny_parser
    servable = Servable(str(export), 1)
    scalars = {"beam_size": 2, "alpha": 0.3, "nbest": 2, "min_length": 2, "max_extra_length": 10}
    outputs = servable.run("translate_with_options", ["The cat sat .", ""], {"target_prefix": ["", ""]}, scalars)
    trees = outputs["trees"]
    assert trees.shape == (2, 2) and trees[1].tolist() == [b"", b""]
    from nltk import Tree

    for text in trees[0]:
        assert Tree.fromstring(text.decode()).leaves() == ["The", "cat", "sat", "."]

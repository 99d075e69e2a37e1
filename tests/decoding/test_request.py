"""A decoding request: one value, each setting's default and range defined once, refused in the same words
in Python (the command line, tft-serve) and in the exported graph."""

import dataclasses

import pytest
import tensorflow as tf

from configs import TransformerConfig, get_config
from configs.decoding import SAMPLING_SETTINGS, SEARCH_SETTINGS
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.request import DecodeRequest, RequestError, Sampling
from tf_transformer.inference.translator import Translator
from tf_transformer.model import build_transformer

EXPORTED = DecodeOptions(beam_size=4, alpha=0.6, max_extra_length=10, max_source_length=30)


def test_defaults_are_the_papers_and_the_documented_ones():
    """Each object's defaults, against values written by hand: section 6.1's search, the documented rest."""
    config, options, request = TransformerConfig(), DecodeOptions(), DecodeRequest()
    assert (config.beam_size, config.alpha, config.max_extra_length) == (4, 0.6, 50)  # section 6.1
    assert (options.beam_size, options.alpha, options.max_extra_length, options.min_length) == (4, 0.6, 50, 2)
    assert request.nbest == 1 and request.is_default()
    assert dataclasses.asdict(Sampling()) == {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 1}


def test_a_request_leaves_the_rest_to_the_model():
    assert DecodeRequest().is_default() and not DecodeRequest(nbest=2).is_default()
    resolved = DecodeRequest(alpha=1.0).resolved(EXPORTED)
    assert (resolved.beam_size, resolved.alpha, resolved.min_length, resolved.max_extra_length) == (4, 1.0, 2, 10)
    assert DecodeRequest(beam_size=8, nbest=3).values(EXPORTED) == {
        "beam_size": 8,
        "alpha": 0.6,
        "nbest": 3,
        "min_length": 2,
        "max_extra_length": 10,
    }
    merged = EXPORTED.merged(DecodeRequest(beam_size=5, max_extra_length=100))
    assert (merged.beam_size, merged.max_extra_length, merged.alpha) == (5, 100, 0.6)


def test_settings_out_of_their_range_are_refused_by_name():
    for values, setting, words in [
        ({"beam_size": 0}, "beam_size", "must be at least 1"),
        ({"alpha": -0.5}, "alpha", "must not be negative"),
        ({"nbest": 0}, "nbest", "must be at least 1"),
        ({"min_length": -1}, "min_length", "must not be negative"),
        ({"beam_size": 2, "nbest": 3}, "nbest", "must be at most beam_size"),
        ({"beam_size": "4"}, "beam_size", "must be an integer"),
        ({"alpha": float("inf")}, "alpha", "must be at most 10"),
        ({"alpha": 1e30}, "alpha", "must be at most 10"),
        ({"alpha": float("nan")}, "alpha", "must not be negative"),
    ]:
        with pytest.raises(RequestError, match=words) as raised:
            DecodeRequest(**values)
        assert raised.value.setting == setting and f"option {setting} " in str(raised.value)
    for values, words in [
        ({"temperature": 0.0}, "temperature must be positive"),
        ({"top_k": -1}, "top_k must not be negative"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"temperature": float("inf")}, "temperature must be at most 100"),
        ({"temperature": 1e8}, "temperature must be at most 100"),
    ]:
        with pytest.raises(RequestError, match="Sampling option " + words):
            Sampling(**values)


def test_sampling_takes_none_of_the_beams_settings():
    with pytest.raises(RequestError, match="takes no nbest, prefix"):
        DecodeRequest(nbest=2, prefix=True, sampling=Sampling())
    request = DecodeRequest.from_settings({"seed": 3, "top_k": 5, "max_extra_length": 6})
    assert request.sampling == Sampling(seed=3, top_k=5) and request.max_extra_length == 6
    assert request.settings() == SAMPLING_SETTINGS and DecodeRequest().settings() == SEARCH_SETTINGS
    with pytest.raises(TypeError, match="no setting beam"):
        DecodeRequest.from_settings({"beam": 4})


def test_a_model_bounds_a_request():
    """An export compiled some beam sizes and sized its cache for its own extra length."""
    assert EXPORTED.beam_sizes() == [1, 2, 4, 8] and DecodeOptions(beam_size=21).beam_sizes() == [1, 2, 4, 8, 21]
    for request, words in [
        (DecodeRequest(beam_size=3), "beam_size must be one of 1, 2, 4, 8, got 3"),
        (DecodeRequest(nbest=5), "nbest must be at most beam_size, got 5"),
        (DecodeRequest(max_extra_length=11), "max_extra_length must be at most 10, this model's most, got 11"),
        (DecodeRequest(min_length=41), "min_length must be at most 40, got 41"),
        (DecodeRequest(max_extra_length=11, sampling=Sampling()), "max_extra_length must be at most 10"),
    ]:
        with pytest.raises(RequestError, match=words):
            request.check(EXPORTED)
    assert DecodeRequest(beam_size=3).check(EXPORTED, compiled_beams=False).beam_size == 3  # in-process: any beam
    assert DecodeRequest(beam_size=8, nbest=8, min_length=40).check(EXPORTED).nbest == 8


def test_the_graph_refuses_a_request_in_the_words_of_the_python_check():
    """The limits are one list: evaluated in Python before a graph runs, and as the graph's assertions."""
    translator = Translator(build_transformer(get_config("tiny")), tokenizer=None, options=EXPORTED)
    for wrong in ({"beam_size": 3}, {"nbest": 5}, {"max_extra_length": 11}, {"min_length": 41}):
        with pytest.raises(RequestError) as in_python:
            DecodeRequest(**wrong).check(EXPORTED)
        words = str(in_python.value).rsplit(", got", 1)[0]
        as_tensors = DecodeRequest(**{name: tf.constant(value) for name, value in wrong.items()})  # as a signature's
        with pytest.raises(tf.errors.InvalidArgumentError, match=words):
            translator._request_checks(translator._as_tensors(as_tensors))  # eager: the assertions run at once
    right = DecodeRequest(**{name: tf.constant(value) for name, value in {"beam_size": 8, "nbest": 8}.items()})
    translator._request_checks(translator._as_tensors(right))

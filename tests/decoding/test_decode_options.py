"""Decoding options: the config's defaults filled in once, flags over them, limits checked, the graph's bound."""

import dataclasses

import pytest

from configs import get_config
from tf_transformer.decoding.decode_options import DecodeOptions


def test_from_config_takes_the_configs_defaults_and_the_flags_given():
    config = get_config("tiny").replace(beam_size=5, alpha=1.0, max_extra_length=7)
    assert DecodeOptions.from_config(config) == DecodeOptions(beam_size=5, alpha=1.0, max_extra_length=7)
    flags = dict(beam_size=None, alpha=0.0, max_extra_length=None, max_output_length=None, batch_parts=2)
    assert DecodeOptions.from_config(config, **flags) == DecodeOptions(
        beam_size=5, alpha=0.0, max_extra_length=7, batch_parts=2
    )
    with pytest.raises(TypeError, match="extra_length"):
        DecodeOptions.from_config(config, extra_length=3)  # one name per setting


def test_options_are_frozen_and_checked():
    options = DecodeOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 2
    assert options.replace(beam_size=2).beam_size == 2 and options.beam_size == 4
    for bad, message in [
        (dict(beam_size=0), "beam_size"),
        (dict(max_output_length=0), "max_output_length"),
        (dict(batch_parts=0), "batch_parts"),
        (dict(max_source_length=1), "at least 2"),
        (dict(truncate_source=True), "needs a max_source_length"),
    ]:
        with pytest.raises(ValueError, match=message):
            DecodeOptions(**bad)


@pytest.mark.parametrize(
    "options, source_length, longest",
    [
        (DecodeOptions(max_extra_length=50), 7, 57),  # section 6.1: input + 50
        (DecodeOptions(max_extra_length=50, max_output_length=40), 7, 40),
        (DecodeOptions(max_extra_length=5, min_length=20), 7, 20),  # the cap rises to the minimum
        (DecodeOptions(max_extra_length=5, min_length=40, max_output_length=40), 70, 40),  # a fixed length
    ],
)
def test_longest_output(options, source_length, longest):
    assert options.longest_output(source_length) == longest

"""ServingOptions: its bounds hold, and docs/serving.md's table states its defaults."""

import dataclasses
import pathlib
import re

import pytest

from configs.serving import ServingOptions

DOCS = pathlib.Path(__file__).parents[2] / "docs" / "serving.md"


def _written(value) -> str:
    """A default as the docs' table writes it: on/off, whole MiB, or the number."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 20} MiB"
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_the_docs_table_states_each_default():
    rows = dict(re.findall(r"^\| `--(\w+)` \| ([^|]+) \|", DOCS.read_text(), re.MULTILINE))
    for field in dataclasses.fields(ServingOptions):
        assert rows.get(field.name, "").strip() == _written(field.default), field.name


def test_values_below_a_bound_are_refused_naming_the_option():
    with pytest.raises(ValueError, match="num_batch_threads must be at least 1, got 0"):
        ServingOptions(num_batch_threads=0)
    with pytest.raises(ValueError, match="batch_timeout_micros"):
        ServingOptions(batch_timeout_micros=-1)
    assert ServingOptions(port=0, rest_api_port=0, batch_timeout_micros=0).timeout_seconds == 30.0
